"""Parquet export and archive throughput against the data plane's read rate, same run.

One embedded nats-server (file store) holds N scored groups on the scored subject. Measured on
the same messages, in the same process, one after the other, each ``--repeats`` times:

* *read*: ``JetStreamPlane.replay`` of the scored subject (direct gets, what every replay
  command and the archive read with), bytes only: the data plane's read rate, the baseline;
* *read + decode*: the same, each message decoded by the codec (what any consumer of the
  experience pays before it can use a group);
* *export*: ``replay export --format parquet``'s path (``export_parquet``): read, decode,
  build the rows, write one Parquet file;
* *archive*: one ``dockyard archive`` pass (``archive_pass``) with a ledger that trained every
  group, 8 groups a step: read, decode, place by step, write one file per step partition.

Rates are groups per second and uncompressed experience MiB per second; the ratio is each
path's rate over *read*'s (1.0: as fast as the data plane can hand the messages out).

    python benchmarks/bench_archive.py [--groups 2000] [--repeats 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from datetime import date
from pathlib import Path

import numpy as np
import structlog
from bench_data_plane import experience_bytes, publish_dockyard
from corpus import load_corpus, make_scored_rollout
from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.parquet_export import export_parquet
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.consumers.archive import archive_pass
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.schemas import ScoredRollout, decode

MiB = 1024 * 1024
GROUPS_PER_STEP = 8


async def read(plane: JetStreamPlane) -> None:
    async for _ in plane.replay(plane.names.scored):
        pass


async def read_decode(plane: JetStreamPlane) -> None:
    async for stored in plane.replay(plane.names.scored):
        decode(stored.headers, stored.data, expected=ScoredRollout)


async def timed(work: Awaitable[object]) -> float:
    """Seconds ``work`` (a coroutine not started yet) takes to run."""
    started = time.perf_counter()
    await work
    return time.perf_counter() - started


async def measure(groups: int, samples: int, tokens: int, repeats: int) -> dict[str, object]:
    corpus = load_corpus()
    rng = np.random.default_rng(7)
    rollouts = [make_scored_rollout(corpus, rng, samples, tokens) for _ in range(groups)]
    logical = sum(experience_bytes(r) for r in rollouts) / MiB
    seconds: dict[str, list[float]] = {"read": [], "read + decode": [], "export": [], "archive": []}
    with tempfile.TemporaryDirectory(prefix="bench-archive-") as scratch:
        root = Path(scratch)
        server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=root / "nats"))
        url = server.start()
        try:
            config = DataPlaneConfig(url=url, namespace="bench", streams={"max_bytes": -1})
            async with JetStreamPlane(config) as plane:
                await publish_dockyard(plane, rollouts, None)
                run_dir = root / "run"
                run_dir.mkdir()
                ledger = Ledger(trail=run_dir / "ledger.jsonl")
                ids = [r.group_id for r in rollouts]
                ledger.record_dispatched(ids)
                for start in range(0, len(ids), GROUPS_PER_STEP):
                    ledger.record_trained(
                        ids[start : start + GROUPS_PER_STEP], start // GROUPS_PER_STEP + 1
                    )
                for attempt in range(repeats):
                    # Alternating cases, so a slow spell of the shared machine hits them all.
                    seconds["read"].append(await timed(read(plane)))
                    seconds["read + decode"].append(await timed(read_decode(plane)))
                    out = root / f"export-{attempt}.parquet"
                    seconds["export"].append(
                        await timed(export_parquet(plane.replay(plane.names.scored), out))
                    )
                    archive = root / f"archive-{attempt}"
                    seconds["archive"].append(
                        await timed(archive_pass(plane, run_dir, archive, "bench"))
                    )
        finally:
            server.stop()
    medians = {case: statistics.median(values) for case, values in seconds.items()}
    return {"groups": groups, "samples": samples, "tokens": tokens, "mib": logical, **medians}


def render(result: dict[str, object], repeats: int) -> list[str]:
    groups, mib = int(result["groups"]), float(result["mib"])  # type: ignore[arg-type]
    base = float(result["read"])  # type: ignore[arg-type]
    lines = [
        f"`python benchmarks/bench_archive.py --groups {groups} --repeats {repeats} "
        f"--write-docs` ({date.today().isoformat()}, embedded nats-server on loopback, file "
        f"store). {groups} scored groups of {result['samples']} samples × {result['tokens']} "
        f"response tokens ({mib:.0f} MiB of uncompressed arrays) on the scored subject; each "
        "path reads all of them with `replay` (direct gets), in the same process, cases "
        f"alternating, medians of {repeats}. Ratio: the path's rate over the data plane's read "
        "rate (*read*), measured in the same run.",
        "",
        "| path | groups/s | MiB/s (uncompressed) | **ratio to read** |",
        "|---|---|---|---|",
    ]
    for case in ("read", "read + decode", "export", "archive"):
        took = float(result[case])  # type: ignore[arg-type]
        lines.append(
            f"| {case} | {groups / took:.0f} | {mib / took:.0f} | **{base / took:.2f}×** |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=240, help="response tokens per sample")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = asyncio.run(measure(args.groups, args.samples, args.tokens, args.repeats))
    lines = render(result, args.repeats)
    print("\n".join(lines))
    if args.write_docs:
        replace_section("archive", ["## Archive and export throughput", "", *lines])
    return 0


if __name__ == "__main__":
    sys.exit(main())
