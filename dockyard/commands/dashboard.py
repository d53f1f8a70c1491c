"""``dockyard dashboard``: the run and its fleet on a web page.

    dockyard dashboard (--config PATH [overrides] | --url nats://...) [--run-dir DIR]
    dockyard dashboard --run-dir DIR                      (a finished run)
                       [--host 127.0.0.1] [--port 8787]

Charts from the run directory's ``metrics.jsonl`` (reward, validation accuracy, loss, tokens/s,
the trainer's idle fraction, the staleness histogram); each role's health from its heartbeat,
stream sizes and consumer lag, and the dead letters with a message browser, from the data plane.
A finished run's embedded broker store (``<run-dir>/nats``) is opened again with a server of the
dashboard's own. The page needs nothing from outside: its script is in the package.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar
from dockyard.commands._plane_args import add_plane_arguments, master_config, open_running_plane

DEFAULT_PORT = 8787


def _run_dir(args: argparse.Namespace) -> Path | None:
    if args.run_dir:
        run_dir = Path(args.run_dir)
        if not run_dir.is_dir():
            raise CliError(f"--run-dir {run_dir}: no such directory")
        return run_dir
    if args.config:  # the run directory the config names, when this machine has it
        run = master_config(args).run
        candidate = Path(run.output_dir) / run.name
        return candidate if candidate.is_dir() else None
    return None


async def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.dashboard.app import create_app
    from dockyard.dashboard.finished_run import start_stored_server, stored_plane
    from dockyard.dashboard.sources import FleetSource, PlaneSource, StatusFilesSource

    run_dir = _run_dir(args)
    if not (args.config or args.url or run_dir):
        raise CliError("give --config or --url (a running fleet), or --run-dir (a finished run)")
    listener = socket.socket()
    try:
        listener.bind((args.host, args.port))
        # Listening before the URL is printed: a client that connects at once waits in the
        # backlog until the server accepts, instead of being refused while it starts.
        listener.listen(128)
    except OSError as error:
        raise CliError(f"--port {args.port}: cannot listen on {args.host}: {error}") from None
    async with contextlib.AsyncExitStack() as stack:
        source: FleetSource
        if args.config or args.url:
            plane = open_running_plane(args, command="dashboard")
            source = PlaneSource(await stack.enter_async_context(plane))
        elif run_dir is not None and (stored := stored_plane(run_dir)) is not None:
            server, config = start_stored_server(stored)
            stack.callback(server.stop)
            plane = JetStreamPlane(config, provision=False, client_name="dockyard-dashboard")
            source = PlaneSource(await stack.enter_async_context(plane))
        else:
            assert run_dir is not None
            source = StatusFilesSource(run_dir / "status")
        app = create_app(run_dir, source)
        host, port = listener.getsockname()[:2]
        print(f"dashboard at http://{host}:{port}/ (Ctrl-C to stop)", flush=True)
        server_config = uvicorn.Config(app, log_level="warning", lifespan="off")
        with _signals_end_the_server_only():
            await uvicorn.Server(server_config).serve(sockets=[listener])
    return 0


@contextlib.contextmanager
def _signals_end_the_server_only() -> Iterator[None]:
    """uvicorn stops on SIGINT/SIGTERM, then raises the signal again for the handler that was
    there before it: the default one would end the process on the spot, before the plane is
    closed and the finished run's nats-server stopped. A no-op handler there lets ``_serve``
    clean up and return."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "dashboard", help="Serve a web page of the run's metrics and its fleet's health"
    )
    add_plane_arguments(parser)
    parser.add_argument("--run-dir", help="the run directory (metrics.jsonl, status, nats store)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default loopback)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any free"
    )
    parser.set_defaults(handler=lambda args: asyncio.run(_serve(args)))
