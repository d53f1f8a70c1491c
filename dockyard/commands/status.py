"""``dockyard status``: the fleet at a glance, from the data plane alone.

    dockyard status (--config PATH [overrides] | --url nats://...) [--json] [--dead-letters N]

Roles (each instance's last heartbeat: state, weight version, deliveries, rate, failures, when
it was last heard from), every stream's size with its consumers' lag, and the dead letters
counted by stage and reason. It runs from any machine that reaches the broker, creates nothing
and acks nothing. ``--json`` prints the same view as one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING

from dockyard.commands._cli import CommandRegistrar
from dockyard.commands._plane_args import add_plane_arguments, open_running_plane

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.fleet.overview import FleetOverview

#: Dead letters are decoded one by one to read their stage: the newest this many are counted
#: unless ``--dead-letters`` says otherwise (the view says how many the stream holds).
DEFAULT_DEAD_LETTER_LIMIT = 10_000


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dockyard.fleet.overview import DeadLetterTally, gather_overview, render_overview

    async def gather() -> FleetOverview:
        async with open_running_plane(args, command="status") as plane:
            return await gather_overview(plane, DeadLetterTally(args.dead_letters))

    overview = asyncio.run(gather())
    if args.json:
        print(json.dumps(overview.to_json(), indent=2))
    else:
        Console().print(render_overview(overview))
    return 0


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
