"""How broker-facing commands find their data plane: ``--config PATH [overrides]`` or ``--url``.

``--config`` reads ``data_plane`` the same way every other command does (YAML + Hydra-style
overrides + validation); ``--url nats://...`` points at a bare server with default settings
(namespace ``dockyard`` unless ``--namespace``). Shared by ``dockyard broker`` and ``replay``.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError
from dockyard.config.sections.data_plane import DataPlaneConfig

if TYPE_CHECKING:
    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.config.master import MasterConfig

EXIT_INVALID_CONFIG = 2


#: Where ``--user``'s password comes from (a secret is never put on a command line).
PASSWORD_VARIABLE = "DOCKYARD_NATS_PASSWORD"


def add_plane_arguments(
    parser: argparse.ArgumentParser,
    *,
    url: bool = True,
    overrides_help: str = "Hydra-style overrides with --config (key=value, +key=value, ~key)",
) -> None:
    parser.add_argument("--config", metavar="PATH", help="YAML config file (its data_plane)")
    if url:
        parser.add_argument("--url", help="nats:// URL of a bare server (instead of --config)")
        parser.add_argument("--namespace", help="data_plane.namespace with --url")
        parser.add_argument(
            "--user", help=f"user name with --url; its password is read from ${PASSWORD_VARIABLE}"
        )
        parser.add_argument(
            "--connect-timeout", type=float, help="seconds to wait for the server with --url"
        )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help=overrides_help,
    )


def master_config(args: argparse.Namespace) -> MasterConfig:
    """The whole config of ``--config PATH [overrides]``; an invalid one exits 2."""
    from dockyard.algorithms.grpo import registered_names
    from dockyard.config.errors import ConfigError
    from dockyard.config.loader import load_config

    try:
        return load_config(args.config, args.overrides, registered=registered_names())
    except ConfigError as error:
        raise CliError(str(error), exit_code=EXIT_INVALID_CONFIG) from None


def plane_config(args: argparse.Namespace) -> DataPlaneConfig:
    url = getattr(args, "url", None)
    if args.config and url:
        raise CliError("give either --config or --url, not both")
    if args.config:
        return master_config(args).data_plane or DataPlaneConfig()
    if args.overrides:
        raise CliError("overrides need --config")
    fields: dict[str, object] = {}
    if url:
        fields["url"] = url
    if getattr(args, "namespace", None):
        fields["namespace"] = args.namespace
    if getattr(args, "connect_timeout", None):
        fields["connect_timeout_s"] = args.connect_timeout
    if getattr(args, "user", None):
        # Never a command-line flag: every local user can read a process's argv.
        password = os.environ.get(PASSWORD_VARIABLE)
        if not password:
            raise CliError(f"--user {args.user} needs its password in ${PASSWORD_VARIABLE}")
        fields["credentials"] = {"user": args.user, "password": password}
    try:
        return DataPlaneConfig.model_validate(fields)
    except ValueError as error:
        raise CliError(f"invalid data plane arguments: {error}", EXIT_INVALID_CONFIG) from None


def open_running_plane(args: argparse.Namespace, *, command: str) -> JetStreamPlane:
    """The running broker's plane, for a command that only looks (``replay``, ``status``,
    ``dashboard``): it provisions nothing. An embedded URL is refused: it would start a server
    of its own, empty, instead of reading the one the run uses."""
    from dockyard.broker.jetstream import JetStreamPlane

    config = plane_config(args)
    if config.is_embedded:
        raise CliError(
            f"{command} reads a running broker: give --url nats://... or a config whose "
            "data_plane.url is a nats:// URL (not 'embedded')"
        )
    return JetStreamPlane(config, provision=False, client_name=f"dockyard-{command}")
