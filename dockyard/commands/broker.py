"""``dockyard broker up``: run the embedded nats-server in the foreground.

    dockyard broker up [--store DIR] [--port N] [--host H] [--secure] [--config PATH [overrides]]

Prints the URL (and, with ``--secure``, one credentials file per role), provisions the streams
and consumers, and runs until Ctrl-C or SIGTERM. ``max_payload``/``max_pending`` and the
namespace come from ``data_plane`` of ``--config`` when given.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands
from dockyard.commands._plane_args import add_plane_arguments, plane_config

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.broker.embedded import ServerAccount
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
    accounts: tuple[ServerAccount, ...] = ()
    credential_files: dict[str, Path] = {}
    if args.secure:
        generated = generate_credentials(names, store / "credentials")
        accounts, credential_files = generated.accounts, generated.files
    settings = EmbeddedServerSettings(
        store_dir=store,
        host=args.host or config.embedded.host,
        port=args.port,
        max_payload=config.max_payload,
        max_pending=config.max_pending,
        accounts=accounts,
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
        _provision(config.model_copy(update={"url": url}), admin)
        print(f"nats-server ready at {url} (store {store}, namespace {config.namespace})")
        for role, path in credential_files.items():
            print(f"credentials for {role}: {path}")
        print("Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            if not server.running:
                raise CliError(f"nats-server exited:\n{server.log_tail}", EXIT_SERVER_FAILED)
    finally:
        server.stop()
    return 0


def _provision(config: DataPlaneConfig, admin_credentials: Path | None) -> None:
    import yaml

    from dockyard.broker.jetstream import JetStreamPlane

    if admin_credentials is not None:
        credentials = yaml.safe_load(admin_credentials.read_text())["data_plane"]["credentials"]
        config = config.model_copy(
            update={"credentials": config.credentials.model_validate(credentials)}
        )

    async def run() -> None:
        async with JetStreamPlane(config, client_name="dockyard-broker-up"):
            pass  # start() provisions

    asyncio.run(run())


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
    add_plane_arguments(up, url=False)
    up.set_defaults(handler=_up)
