"""``dockyard replay trace GROUP_ID``: the lineage of one group, from the stored streams, the
dead letters and (with ``--run-dir``) the trainer's ledger.

    dockyard replay trace GROUP_ID [--run-dir RUN] [--json] (--config PATH | --url nats://...)
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dockyard.commands._cli import CliError, CommandRegistrar
from dockyard.commands._plane_args import add_plane_arguments

if TYPE_CHECKING:  # imported lazily at run time
    from dockyard.broker.trace import GroupTrace

#: ``replay``'s helpers: open the running broker's plane (refusing an embedded one), and run a
#: coroutine turning data-plane errors into one-line CLI errors.
OpenPlane = Callable[[argparse.Namespace], Any]
RunSync = Callable[[Coroutine[Any, Any, Any]], Any]


def _trace(args: argparse.Namespace, open_plane: OpenPlane, run_sync: RunSync) -> int:
    from dockyard.broker.trace import render, trace_group
    from dockyard.consumers.trainer.ledger import read_trail

    ledger = None
    if args.run_dir is not None:
        trail = Path(args.run_dir) / "ledger.jsonl"
        if not trail.is_file():
            raise CliError(
                f"--run-dir {args.run_dir}: no ledger.jsonl there (not a run directory?)"
            )
        ledger = read_trail(trail)

    async def run() -> GroupTrace:
        async with open_plane(args) as plane:
            names = plane.names
            messages = [m async for m in plane.replay(names.prompts)]
            messages += [m async for m in plane.replay(names.rollouts)]
            messages += [m async for m in plane.replay(names.scored)]
            dead = [m async for m in plane.replay(names.dead_letters)]
            return trace_group(args.group_id, messages, dead, ledger)

    trace = run_sync(run())
    if args.json:
        print(json.dumps(trace.to_json(), indent=2))
    else:
        print(render(trace, ledger_read=ledger is not None))
    return 0 if trace.found else 1


def register(commands: CommandRegistrar, *, open_plane: OpenPlane, run: RunSync) -> None:
    trace = commands.add(
        "trace", help="One group's lineage: prompt, deliveries, worker, weights, reward, step"
    )
    trace.add_argument("group_id", metavar="GROUP_ID")
    trace.add_argument("--run-dir", help="the trainer's run directory (reads its ledger.jsonl)")
    trace.add_argument("--json", action="store_true", help="the trace as one JSON document")
    add_plane_arguments(trace)
    trace.set_defaults(handler=functools.partial(_trace, open_plane=open_plane, run_sync=run))
