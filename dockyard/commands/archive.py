"""``dockyard archive``: a run's scored experience to Parquet, partitioned by run and step.

    dockyard archive --run-dir RUN --out DIR (--config PATH | --url nats://... [--namespace NS])
                     [--run NAME] [--follow [--interval S]]

Each pass archives the scored groups stored since the last one whose fate the trainer's ledger
knows (:mod:`dockyard.consumers.archive`); ``--follow`` repeats passes until interrupted, so
the archive trails the trainer. Messages that cannot be archived are named on stderr and kept,
with their bytes, in ``DIR/run=NAME/refused.jsonl``; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from dockyard.commands._cli import CliError, CommandRegistrar
from dockyard.commands._common import on_shutdown_signals
from dockyard.commands._plane_args import add_plane_arguments, plane_config

DEFAULT_INTERVAL_S = 30.0


def _archive(args: argparse.Namespace) -> int:
    from dockyard.broker.inspect import export_record
    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.broker.plane import DataPlaneError
    from dockyard.consumers.archive import archive_pass

    run_dir, out = Path(args.run_dir), Path(args.out)
    run = args.run or run_dir.resolve().name
    if not run or "/" in run or "=" in run:
        raise CliError(f"--run {run!r}: a partition value has no '/' or '='", 2)
    config = plane_config(args)
    if config.is_embedded:
        raise CliError(
            "archive reads a running broker: give --url nats://... or a config "
            "whose data_plane.url is a nats:// URL (not 'embedded')",
            2,
        )
    refused_file = out / f"run={run}" / "refused.jsonl"
    refused_total = 0

    async def run_passes() -> None:
        nonlocal refused_total
        stop = asyncio.Event()
        if args.follow:
            on_shutdown_signals(stop.set)
        async with JetStreamPlane(config, provision=False, client_name="dockyard-archive") as plane:
            while True:
                done = await archive_pass(plane, run_dir, out, run)
                result = done.result
                print(
                    f"archived {result.rows} samples of {result.groups} groups "
                    f"(seq {done.from_seq}..{done.next_seq - 1}) into {len(result.files)} files"
                    + (
                        f"; waiting at seq {result.stopped_at} (not settled)"
                        if result.stopped_at
                        else ""
                    )
                )
                if result.refused:
                    refused_file.parent.mkdir(parents=True, exist_ok=True)
                    with refused_file.open("a") as handle:
                        for item in result.refused:
                            record = export_record(item.stored)
                            record["refused"] = {"reason": item.reason, "detail": item.detail}
                            handle.write(json.dumps(record) + "\n")
                            print(
                                f"left out seq {item.stored.seq}: {item.reason}: {item.detail}",
                                file=sys.stderr,
                            )
                    refused_total += len(result.refused)
                if not args.follow:
                    return
                # A poll period, not a synchronisation: the pass reads whatever is stored.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.interval):
                        await stop.wait()
                if stop.is_set():
                    return

    try:
        asyncio.run(run_passes())
    except FileNotFoundError as error:
        raise CliError(str(error), 2) from None
    except DataPlaneError as error:
        raise CliError(str(error)) from None
    if refused_total:
        print(f"{refused_total} messages left out, listed in {refused_file}", file=sys.stderr)
        return 1
    return 0


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add(
        "archive", help="Archive a run's scored experience to Parquet, partitioned by run and step"
    )
    parser.add_argument("--run-dir", required=True, help="the run's directory (its ledger)")
    parser.add_argument("--out", required=True, help="the archive's root directory")
    parser.add_argument("--run", help="the run partition's value (default: the run dir's name)")
    parser.add_argument("--follow", action="store_true", help="keep archiving until stopped")
    parser.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between passes"
    )
    add_plane_arguments(parser)
    parser.set_defaults(handler=_archive)
