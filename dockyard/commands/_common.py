"""What the commands share: config loading (exit 2 on a bad config), status files, signal
handling for a graceful drain."""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError

if TYPE_CHECKING:  # imported lazily at run time: a command loads only what it uses
    from dockyard.config.loader import ConfigReport
    from dockyard.config.master import MasterConfig

EXIT_INVALID_CONFIG = 2

#: Keys whose values are secrets; on a command line they are readable by every local user
#: (``ps``, ``/proc/PID/cmdline``), so they are refused there.
SECRET_KEYS = ("data_plane.credentials.password", "data_plane.credentials.token")
_URL_WITH_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")


def secrets_in_overrides(overrides: list[str]) -> list[str]:
    """The key paths of ``overrides`` that carry a secret (a password in a URL included)."""
    found = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        in_url = key.startswith("data_plane.") and _URL_WITH_PASSWORD.search(value)
        if key in SECRET_KEYS or in_url:
            found.append(key)
    return found


def load_config_report_or_exit(args: argparse.Namespace) -> ConfigReport:
    """``--config`` + overrides, validated; warnings to stderr; a bad config is exit 2."""
    from dockyard.algorithms.grpo import registered_names
    from dockyard.config.errors import ConfigError
    from dockyard.config.loader import load_config_report

    if leaked := secrets_in_overrides(args.overrides):
        raise CliError(
            f"{', '.join(leaked)}: secrets are refused on the command line, where every local "
            "user can read them (ps, /proc/PID/cmdline); put them in the config file (keep it "
            "0600; `broker up --secure` writes such files)",
            exit_code=EXIT_INVALID_CONFIG,
        )
    try:
        report = load_config_report(args.config, args.overrides, registered=registered_names())
    except ConfigError as error:
        raise CliError(str(error), exit_code=EXIT_INVALID_CONFIG) from None
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return report


def load_role_config(args: argparse.Namespace) -> MasterConfig:
    """The config of a command that starts work: also refused (exit 2) when it asks for
    something this build does not implement (``dockyard.config.capabilities``)."""
    from dockyard.config.capabilities import ignored, not_implemented
    from dockyard.models.vision_support import vision_issues

    config = load_config_report_or_exit(args).config
    missing = not_implemented(config) + vision_issues(config)
    if missing:
        lines = "\n".join(f"  {issue}" for issue in missing)
        raise CliError(
            f"this config asks for what this build cannot run:\n{lines}",
            exit_code=EXIT_INVALID_CONFIG,
        )
    for issue in ignored(config):
        print(f"warning: {issue}", file=sys.stderr)
    return config


def add_status_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status-dir", default=None, help="write heartbeat JSON files here (used by `run`)"
    )


def on_shutdown_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT ask the role to drain instead of dying mid-message."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
