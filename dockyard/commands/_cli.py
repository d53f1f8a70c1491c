"""What command modules need from the ``dockyard`` command: the registrar they add their parsers
with, the shared ``--config`` arguments, and :class:`CliError`.

It lives here, below both, so that :mod:`dockyard.cli` imports the commands and the commands never
import ``cli`` back (imports point one way).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from rich_argparse import RichHelpFormatter

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """A failure to report as one line on stderr, with an exit status, and no traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class CommandRegistrar:
    """Hands command modules a way to add their parsers to the top-level command."""

    # argparse exposes no public type for this
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser]

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
