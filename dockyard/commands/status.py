"""``dockyard status``: the fleet at a glance, from the data plane alone.

    dockyard status (--config PATH [overrides] | --url nats://...) [--json] [--dead-letters N]
    dockyard status --run-dir DIR [--json]                 (a finished run)

Roles (each instance's last heartbeat: state, weight version, deliveries, rate, failures, when
it was last heard from), every stream's size with its consumers' lag, and the dead letters
counted by stage and reason. It runs from any machine that reaches the broker, creates nothing
and acks nothing. ``--json`` prints the same view as one JSON document. A finished run's own
embedded store (``<run-dir>/nats``) is read by a server started on it for the view, as
``dockyard dashboard --run-dir`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.commands._cli import CliError, CommandRegistrar
from dockyard.commands._plane_args import add_plane_arguments, open_running_plane

if TYPE_CHECKING:  # imported lazily at run time
    from collections.abc import AsyncIterator

    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.fleet.overview import FleetOverview

#: Dead letters are decoded one by one to read their stage: the newest this many are counted
#: unless ``--dead-letters`` says otherwise (the view says how many the stream holds).
DEFAULT_DEAD_LETTER_LIMIT = 10_000


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dockyard.fleet.overview import DeadLetterTally, gather_overview, render_overview

    if args.run_dir and (args.config or args.url):
        raise CliError("--run-dir reads a finished run: give it alone, without --config or --url")
    if not (args.run_dir or args.config or args.url):
        raise CliError("give --config or --url (a running fleet), or --run-dir (a finished run)")

    async def gather() -> FleetOverview:
        async with contextlib.AsyncExitStack() as stack:
            if args.run_dir:
                plane = await stack.enter_async_context(_finished_run_plane(Path(args.run_dir)))
            else:
                plane = await stack.enter_async_context(open_running_plane(args, command="status"))
            return await gather_overview(plane, DeadLetterTally(args.dead_letters))

    overview = asyncio.run(gather())
    if args.json:
        print(json.dumps(overview.to_json(), indent=2))
    else:
        Console().print(render_overview(overview))
    return 0


@contextlib.asynccontextmanager
async def _finished_run_plane(run_dir: Path) -> AsyncIterator[JetStreamPlane]:
    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.dashboard.finished_run import start_stored_server, stored_plane

    if not run_dir.is_dir():
        raise CliError(f"--run-dir {run_dir}: no such directory")
    stored = stored_plane(run_dir)
    if stored is None:
        raise CliError(
            f"--run-dir {run_dir}: no broker store of its own (a run with data_plane: null, or "
            "one whose broker lives elsewhere: give that broker's --url)"
        )
    server, config = start_stored_server(stored)
    try:
        async with JetStreamPlane(config, provision=False, client_name="dockyard-status") as plane:
            yield plane
    finally:
        server.stop()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a count of at least 1")
    return value


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "status",
        help="The fleet at a glance: roles, versions, lag, stream sizes, dead letters",
    )
    add_plane_arguments(parser)
    parser.add_argument(
        "--run-dir", help="a finished run's directory: its own broker store (<run-dir>/nats)"
    )
    parser.add_argument("--json", action="store_true", help="print the view as JSON")
    parser.add_argument(
        "--dead-letters",
        type=_positive,
        default=DEFAULT_DEAD_LETTER_LIMIT,
        metavar="N",
        help=f"count the newest N dead letters by stage and reason "
        f"(default {DEFAULT_DEAD_LETTER_LIMIT})",
    )
    parser.set_defaults(handler=_status)
