"""The ``dockyard`` command.

Subcommands are plug-ins: every module in :mod:`dockyard.commands` that defines
``register(registrar)`` is discovered at start-up, so a new subcommand is a new module and never an
edit to a central dispatch chain. Command modules import heavy dependencies (torch, nats) inside
their handlers, so ``dockyard --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich_argparse import RichHelpFormatter

from dockyard import __version__
from dockyard.utils.logging import configure_logging

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """A failure to report as one line on stderr, with an exit status, and no traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class CommandRegistrar:
    """Hands command modules a way to add their parsers to the top-level command."""

    subparsers: argparse._SubParsersAction  # argparse exposes no public type for this

    def add(
        self, name: str, *, help: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        return self.subparsers.add_parser(
            name,
            help=help,
            description=description or help,
            formatter_class=RichHelpFormatter,
        )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config PATH`` followed by Hydra dot-notation overrides (``a.b=1 +c=2 ~d``)."""
    parser.add_argument("--config", required=True, metavar="PATH", help="YAML config file")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra-style overrides: key=value, +key=value (add), ++key=value (add or set), ~key",
    )


def add_subcommands(parser: argparse.ArgumentParser, *, dest: str) -> CommandRegistrar:
    """Nested subcommands (``dockyard config show``) use the same registrar type."""
    subparsers = parser.add_subparsers(dest=dest, metavar="COMMAND", required=True)
    return CommandRegistrar(subparsers)


def _discover_command_modules() -> list[str]:
    import dockyard.commands as commands_package

    return sorted(
        f"{commands_package.__name__}.{info.name}"
        for info in pkgutil.iter_modules(commands_package.__path__)
        if not info.name.startswith("_")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dockyard",
        description="Asynchronous GRPO post-training over NATS JetStream.",
        formatter_class=RichHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dockyard {__version__}")
    parser.add_argument(
        "--log-format",
        choices=["auto", "console", "json"],
        default="auto",
        help="console on a terminal and JSON lines otherwise, unless set",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    registrar = add_subcommands(parser, dest="command")
    for module_name in _discover_command_modules():
        module = importlib.import_module(module_name)
        register = getattr(module, "register", None)
        if register is None:
            raise RuntimeError(f"command module {module_name} defines no register(registrar)")
        register(registrar)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_format, args.log_level.upper())
    handler: Handler = args.handler
    try:
        return handler(args)
    except CliError as error:
        print(f"dockyard: error: {error}", file=sys.stderr)
        return error.exit_code
    except Exception as error:
        # Errors that explain themselves (a data plane that refuses, a missing binary) are
        # reported as one line; anything else keeps its traceback for debugging.
        if type(error).__module__.startswith("dockyard.") and args.log_level.upper() != "DEBUG":
            print(f"dockyard: error: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        print("dockyard: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # Re-import so exception classes match those the command modules import from dockyard.cli.
    from dockyard.cli import main as package_main

    sys.exit(package_main())
