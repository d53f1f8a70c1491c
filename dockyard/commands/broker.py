"""``dockyard broker up``: run the embedded nats-server in the foreground.

    dockyard broker up [--store DIR] [--port N] [--host H] [--secure] [--update-limits]
        [--config PATH [overrides]] [--leafnodes HOST:PORT | --hub URL [--leaf-credentials FILE]]

Prints the URL (and, with ``--secure``, one credentials file per role), provisions the streams
and consumers, and runs until Ctrl-C or SIGTERM. ``max_payload``/``max_pending``, the namespace
and the limits of the streams it creates come from ``data_plane`` of ``--config`` when given.

A store's existing streams keep their limits (serving a finished run's store to replay it must
not rewrite it): each difference from the config is printed, and ``--update-limits`` applies the
config's, printing each change. Streams the store's disk cannot reserve are refused, with the
numbers, before any is created (exit status 2).

One site of a multi-site plane (``data_plane.site``; ``docs/operations.md``, "Multi-site"): the
server's JetStream domain is ``data_plane.site.domain``; the trainer's site accepts its rollout
sites' leaf connections on ``--leafnodes`` (with ``--secure``: one leaf user per rollout site,
written to ``credentials/leaf-<domain>.yaml``), a rollout site joins it with ``--hub`` (with
``--secure``: ``--leaf-credentials`` is that file).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands
from dockyard.commands._plane_args import EXIT_INVALID_CONFIG, add_plane_arguments, plane_config
from dockyard.config.sections.data_plane import DataPlaneConfig

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.broker.embedded import ServerAccount
    from dockyard.broker.plane import ProvisionReport
    from dockyard.config.sections.data_plane import DataPlaneConfig

DEFAULT_PORT = 4222
EXIT_SERVER_FAILED = 3


def _up(args: argparse.Namespace) -> int:
    from dockyard.broker.embedded import (
        EmbeddedNatsServer,
        EmbeddedServerError,
        EmbeddedServerSettings,
    )
    from dockyard.broker.names import PlaneNames
    from dockyard.broker.security import generate_credentials

    config = plane_config(args)
    store = Path(args.store or config.embedded.store_dir or "dockyard-nats-store").resolve()
    names = PlaneNames(config.namespace)
    jetstream_extra, extra, leaf_files = _site_settings(args, config, store / "credentials")
    accounts: tuple[ServerAccount, ...] = ()
    credential_files: dict[str, Path] = {}
    if args.secure:
        generated = generate_credentials(names, store / "credentials", config.site)
        accounts, credential_files = generated.accounts, generated.files
    settings = EmbeddedServerSettings(
        store_dir=store,
        host=args.host or config.embedded.host,
        port=args.port,
        max_payload=config.max_payload,
        max_pending=config.max_pending,
        accounts=accounts,
        jetstream_extra=jetstream_extra,
        extra=extra,
    )
    try:
        server = EmbeddedNatsServer(settings)
        url = server.start()
    except EmbeddedServerError as error:
        raise CliError(str(error), EXIT_SERVER_FAILED) from None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        admin = credential_files.get("admin")
        report = _provision(
            config.model_copy(update={"url": url}), admin, store, update_limits=args.update_limits
        )
        for line in _limit_lines(report):
            print(line)
        print(f"nats-server ready at {url} (store {store}, namespace {config.namespace})")
        for role, path in credential_files.items():
            print(f"credentials for {role}: {path}")
        for domain, path in leaf_files.items():
            print(f"leaf credentials for site {domain}: {path}")
        print("Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                raise CliError(f"nats-server exited:\n{server.log_tail}", EXIT_SERVER_FAILED)
    finally:
        server.stop()
    return 0


def _site_settings(
    args: argparse.Namespace, config: DataPlaneConfig, credentials_dir: Path
) -> tuple[dict[str, str], dict[str, str], dict[str, Path]]:
    """The server's JetStream domain and leaf node settings for its site, and the leaf
    credential files written for the rollout sites (trainer site with ``--secure``)."""
    from dockyard.broker.security import (
        DATA_ACCOUNT,
        generate_leaf_credentials,
        read_leaf_credentials,
    )
    from dockyard.broker.sites import hub_leafnodes, leaf_remote

    site = config.site
    if args.leafnodes and args.hub:
        raise CliError(
            "a site either accepts leaf nodes (--leafnodes) or joins a hub (--hub)",
            EXIT_INVALID_CONFIG,
        )
    if args.leaf_credentials and not (args.hub and args.secure):
        raise CliError("--leaf-credentials goes with --hub and --secure", EXIT_INVALID_CONFIG)
    if (args.leafnodes or args.hub) and site.domain is None:
        raise CliError(
            "--leafnodes/--hub: set data_plane.site.domain (this server's domain)",
            EXIT_INVALID_CONFIG,
        )
    if args.leafnodes and not site.rollout_domains:
        raise CliError(
            "--leafnodes: data_plane.site.rollout_domains names no rollout site",
            EXIT_INVALID_CONFIG,
        )
    if args.hub and site.trainer_domain is None:
        raise CliError(
            "--hub: data_plane.site.trainer_domain names no trainer site", EXIT_INVALID_CONFIG
        )
    jetstream_extra = {"domain": site.domain} if site.domain else {}
    extra = {"server_name": f"site_{site.domain}"} if site.domain else {}
    # The leaf connection joins the account holding the streams at both ends (the data account
    # with --secure, the global one without), whose JetStream API the sources/mirrors call.
    account = DATA_ACCOUNT if args.secure else None
    leaf_files: dict[str, Path] = {}
    if args.leafnodes:
        leaves = (
            generate_leaf_credentials(site.rollout_domains, credentials_dir) if args.secure else {}
        )
        extra["leafnodes"] = hub_leafnodes(args.leafnodes, [c for c, _ in leaves.values()], account)
        leaf_files = {domain: path for domain, (_, path) in leaves.items()}
    if args.hub:
        if args.secure and not args.leaf_credentials:
            raise CliError(
                "--hub with --secure needs --leaf-credentials FILE (the trainer site's "
                "`broker up --secure --leafnodes` writes credentials/leaf-<domain>.yaml)",
                EXIT_INVALID_CONFIG,
            )
        try:
            credentials = (
                read_leaf_credentials(Path(args.leaf_credentials))
                if args.leaf_credentials
                else None
            )
        except ValueError as error:
            raise CliError(str(error), EXIT_INVALID_CONFIG) from None
        extra["leafnodes"] = leaf_remote(args.hub, config.namespace, credentials, account)
    return jetstream_extra, extra, leaf_files


def _provision(
    config: DataPlaneConfig, admin_credentials: Path | None, store: Path, *, update_limits: bool
) -> ProvisionReport:
    import yaml

    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.broker.plane import InsufficientStorage

    if admin_credentials is not None:
        credentials = yaml.safe_load(admin_credentials.read_text())["data_plane"]["credentials"]
        config = config.model_copy(
            update={"credentials": config.credentials.model_validate(credentials)}
        )

    async def run() -> ProvisionReport:
        async with JetStreamPlane(
            config, provision=False, client_name="dockyard-broker-up"
        ) as plane:
            return await plane.provision(update_limits=update_limits, local_store=store)

    try:
        return asyncio.run(run())
    except InsufficientStorage as error:
        raise CliError(str(error), EXIT_INVALID_CONFIG) from None


def _limit_lines(report: ProvisionReport) -> list[str]:
    """What provisioning did to the store's existing streams' limits, one line each: kept
    (the store's own, reported), or changed (``--update-limits``)."""
    lines = [
        f"stream {d.stream} keeps its limits: {d.field} {d.existing} (the config asks "
        f"{d.configured}; --update-limits applies the config's)"
        for d in report.kept
    ]
    lines.extend(
        f"stream {d.stream}: {d.field} {d.existing} -> {d.configured} (--update-limits)"
        for d in report.changed
    )
    return lines


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("broker", help="Run or manage the NATS JetStream data plane")
    commands = add_subcommands(parser, dest="broker_command")
    up = commands.add("up", help="Run the embedded nats-server (JetStream) in the foreground")
    up.add_argument("--store", metavar="DIR", help="JetStream store directory")
    up.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"client port (default {DEFAULT_PORT}; -1 = any free)",
    )
    up.add_argument("--host", help="listen address (default: data_plane.embedded.host, loopback)")
    up.add_argument(
        "--secure", action="store_true", help="generate per-role users with subject permissions"
    )
    up.add_argument(
        "--update-limits",
        action="store_true",
        help="apply data_plane.streams' limits to the store's existing streams (printed); "
        "without it they keep their own. A lower max_bytes deletes the oldest messages past it",
    )
    up.add_argument(
        "--leafnodes",
        metavar="HOST:PORT",
        help="trainer site of a multi-site plane: accept the rollout sites' leaf connections here",
    )
    up.add_argument(
        "--hub",
        metavar="URL",
        help="rollout site: join the trainer site's leaf node listener (nats-leaf://host:port)",
    )
    up.add_argument(
        "--leaf-credentials",
        metavar="FILE",
        help="rollout site with --secure: this site's leaf user, as the trainer site wrote it",
    )
    add_plane_arguments(up, url=False)
    up.set_defaults(handler=_up)
