"""The ``dockyard`` command.

Subcommands are plug-ins: every module in :mod:`dockyard.commands` that defines
``register(registrar)`` is discovered at start-up, so a new subcommand is a new module and never an
edit to a central dispatch chain. Command modules import heavy dependencies (torch, nats) inside
their handlers, so ``dockyard --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from rich_argparse import RichHelpFormatter

import dockyard.commands as commands_package
from dockyard import __version__
from dockyard.commands._cli import CliError, Handler, add_subcommands
from dockyard.utils.logging import configure_logging


def _discover_command_modules() -> list[str]:
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
    except BrokenPipeError:
        # The reader went away (`dockyard replay trace --json | head`): not an error of ours.
        # Python's own recipe: point stdout at devnull so the exit's flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command cut off by its pipe
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
    sys.exit(main())
