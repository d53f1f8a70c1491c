"""End-to-end experience throughput over JetStream vs raw nats-py bytes of the same size.

Dockyard path: encode a ScoredRollout (codec: msgpack + zstd) → ``JetStreamPlane.publish`` (one
message, or chunks by reference above the payload cap) → durable pull ``fetch`` → ``decode`` →
ack. Baseline: raw nats-py ``js.publish`` of opaque random bytes as large as the rollout's
uncompressed arrays (split into ≤ max-payload messages where needed), ``fetch`` + ack, measured
in the same run against the same embedded server. Throughput counts *uncompressed experience
bytes* (the producer's arrays) per second; the ratio is dockyard / raw.

Two shapes, both for dockyard and for raw nats-py:

* *pipeline*: a producer process publishes while the consumer process pulls and decodes, as a
  rollout fleet and a trainer do (the throughput of the pipeline);
* *sequential*: one process publishes everything, then consumes it (every stage's CPU on one
  core, one after the other: the cost per group).

    python benchmarks/bench_data_plane.py [--seconds-per-case 3] [--write-docs]

The sequential shape also reports the client's CPU per group (``time.process_time`` of the one
process, the server excluded), which a loaded machine blurs far less than wall-clock rates.
``--baseline-tree DIR`` compares this tree with another checkout of dockyard in the same run:
each round runs this script once under each tree's ``PYTHONPATH`` (their order alternating) and
the medians of the rounds' ratios are printed side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import nats
import numpy as np
import structlog
from corpus import load_corpus, make_scored_rollout
from nats.js import JetStreamContext, api
from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import DataPlane, OutgoingMessage
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import EncodedMessage, ScoredRollout, decode, encode

MiB = 1024 * 1024
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
SIZES = {"64 KiB": 64 * 1024, "1 MiB": MiB, "8 MiB": 8 * MiB, "40 MiB": 40 * MiB}
MAX_PAYLOAD = 8 * MiB


def experience_bytes(scored: ScoredRollout) -> int:
    return sum(
        a.nbytes
        for s in scored.rollout.samples
        for a in (
            s.prompt_token_ids,
            s.response_token_ids,
            s.behaviour_logprobs,
            s.token_weight_versions,
            s.loss_mask,
        )
    )


def build_rollouts(target: int, count: int) -> list[ScoredRollout]:
    corpus = load_corpus()
    rng = np.random.default_rng(7)
    samples = 16 if target <= MiB else 64
    tokens = max(16, (target // samples - 256 * 4) // 13)
    return [make_scored_rollout(corpus, rng, samples, tokens) for _ in range(count)]


def plane_config(url: str, namespace: str) -> DataPlaneConfig:
    return DataPlaneConfig.model_validate(
        {
            "url": url,
            "namespace": namespace,
            "max_payload": MAX_PAYLOAD,
            "streams": {"max_bytes": -1},
            "consumer": {"fetch_batch": 16, "ack_wait_s": 120},
            "publish": {"timeout_s": 60},
        }
    )


# ----------------------------------------------------------------------------- the two paths
# Each side is one function, so that the sequential run (one process: publish everything, then
# consume it) and the pipeline (a producer process and a consumer process at once) move the
# same messages the same way.

WINDOW = 32


async def publish_dockyard(
    plane: DataPlane, rollouts: list[ScoredRollout], encoded: list[EncodedMessage] | None
) -> None:
    """Encode (unless ``encoded``) and publish, pipelined in windows as producers do."""
    window: list[OutgoingMessage] = []
    for index, rollout in enumerate(rollouts):
        message = encode(rollout) if encoded is None else encoded[index]
        headers = dict(message.headers)
        msg_id = headers.pop("Nats-Msg-Id")
        window.append(OutgoingMessage(plane.names.scored, message.payload, msg_id, headers))
        if len(window) == WINDOW:
            await plane.publish_many(window)
            window.clear()
    await plane.publish_many(window)


async def consume_dockyard(plane: DataPlane, count: int, *, codec: bool = True) -> None:
    received = 0
    while received < count:
        for delivery in await plane.fetch(plane.names.scored_consumer, timeout_s=5):
            if codec:
                decode(delivery.headers, delivery.data, expected=ScoredRollout)
            await delivery.ack()
            received += 1


def raw_messages(sizes: list[int]) -> list[bytes]:
    """Random (incompressible) bytes as large as each group's arrays, split at the payload cap."""
    piece = MAX_PAYLOAD - 64 * 1024
    messages: list[bytes] = []
    for size in sizes:
        blob = os.urandom(min(size, piece))
        messages += [blob] * -(-size // piece)
    return messages


async def publish_raw(js: JetStreamContext, subject: str, messages: list[bytes], case: str) -> None:
    # The plane's defaults: 32 messages, at most 64 MiB in flight (past the server's 128 MB
    # ingest buffer it refuses with 429, which nats-py never reports).
    window = max(1, min(WINDOW, (64 * MiB) // max(len(m) for m in messages)))
    for start in range(0, len(messages), window):
        futures = [
            await js.publish_async(subject, message, headers={"Nats-Msg-Id": f"{case}{index}"})
            for index, message in enumerate(messages[start : start + window], start)
        ]
        async with asyncio.timeout(120):
            await asyncio.gather(*futures)


async def consume_raw(
    subscription: JetStreamContext.PullSubscription, messages: list[bytes]
) -> None:
    # batch × size stays under max_pending (nats notes: larger batches get disconnected)
    batch = max(1, min(16, (32 * MiB) // max(len(m) for m in messages)))
    received = 0
    while received < len(messages):
        try:
            fetched = await subscription.fetch(batch, timeout=5)
        except TimeoutError:
            continue
        for msg in fetched:
            await msg.ack()
            received += 1


@asynccontextmanager
async def raw_stream(url: str, case: str) -> AsyncIterator[tuple[JetStreamContext, str, Any]]:
    """A stream and durable pull consumer of its own for raw nats-py."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=60)
        stream, subject = f"raw{abs(hash(case)) % 10**8}", f"raw.{abs(hash(case)) % 10**8}"
        await js.add_stream(api.StreamConfig(name=stream, subjects=[subject]))
        await js.add_consumer(stream, api.ConsumerConfig(durable_name="c", ack_wait=120))
        yield js, subject, await js.pull_subscribe_bind("c", stream=stream)
    finally:
        await nc.close()


# ----------------------------------------------------------------------------- sequential


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds, and this process's CPU seconds (``time.process_time``) meanwhile."""

    wall: float
    cpu: float


async def dockyard_path(
    url: str, rollouts: list[ScoredRollout], case: str, *, codec: bool = True
) -> Timing:
    """Time to move ``rollouts`` through the plane; ``codec=False`` moves payloads encoded
    beforehand and skips decoding (the transport's share of the time, for the reading)."""
    config = plane_config(url, f"bench{abs(hash((case, codec))) % 10**8}")
    encoded = None if codec else [encode(rollout) for rollout in rollouts]
    async with JetStreamPlane(config) as plane:
        started, cpu = time.perf_counter(), time.process_time()
        await publish_dockyard(plane, rollouts, encoded)
        await consume_dockyard(plane, len(rollouts), codec=codec)
        return Timing(time.perf_counter() - started, time.process_time() - cpu)


async def raw_path(url: str, sizes: list[int], case: str) -> Timing:
    messages = raw_messages(sizes)
    async with raw_stream(url, case) as (js, subject, subscription):
        started, cpu = time.perf_counter(), time.process_time()
        await publish_raw(js, subject, messages, case)
        await consume_raw(subscription, messages)
        return Timing(time.perf_counter() - started, time.process_time() - cpu)


# ----------------------------------------------------------------------------- pipeline


@dataclass(frozen=True)
class ProducerJob:
    """What the producer process publishes: it rebuilds the same groups (seeded)."""

    url: str
    case: str
    target: int
    count: int
    raw_subject: str | None  # None: dockyard (the plane's namespace is the case)


def produce(job: ProducerJob, ready: Any, go: Any) -> None:
    """The producer process: build the inputs, say ready, publish everything at ``go``."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rollouts = build_rollouts(job.target, job.count)
    gc.freeze()  # the prebuilt inputs (a real producer holds none) stay out of the cyclic GC

    async def run() -> None:
        if job.raw_subject is not None:
            messages = raw_messages([experience_bytes(r) for r in rollouts])
            nc = await nats.connect(job.url)
            ready.set()
            go.wait()
            await publish_raw(nc.jetstream(timeout=60), job.raw_subject, messages, job.case)
            await nc.close()
            return
        async with JetStreamPlane(plane_config(job.url, job.case)) as plane:
            ready.set()
            go.wait()
            await publish_dockyard(plane, rollouts, None)

    asyncio.run(run())


async def pipeline(
    url: str, rollouts: list[ScoredRollout], target: int, case: str, *, raw: bool
) -> float:
    """Seconds from the start signal until the consumer (this process) has every group, while
    a producer process publishes them: the shape of a deployment."""
    context = multiprocessing.get_context("spawn")
    ready, go = context.Event(), context.Event()

    async def timed(consume: Callable[[], Awaitable[None]], job: ProducerJob) -> float:
        producer = context.Process(target=produce, args=(job, ready, go))
        producer.start()
        try:
            await asyncio.to_thread(ready.wait)
            started = time.perf_counter()
            go.set()
            await consume()
            return time.perf_counter() - started
        finally:
            await asyncio.to_thread(producer.join)

    if raw:
        messages = raw_messages([experience_bytes(r) for r in rollouts])
        async with raw_stream(url, case) as (_, subject, subscription):
            job = ProducerJob(url, case, target, len(rollouts), subject)
            return await timed(lambda: consume_raw(subscription, messages), job)
    namespace = f"pipe{abs(hash(case)) % 10**8}"
    async with JetStreamPlane(plane_config(url, namespace)) as plane:
        job = ProducerJob(url, namespace, target, len(rollouts), None)
        return await timed(lambda: consume_dockyard(plane, len(rollouts)), job)


#: case, messages, wire bytes per group, then MiB/s: pipeline dockyard, pipeline raw,
#: sequential dockyard, sequential raw, sequential dockyard without the codec; then the
#: sequential client CPU per group in µs: dockyard, raw nats-py, dockyard without the codec.
Row = tuple[str, int, int, float, float, float, float, float, float, float, float]


async def run(seconds_per_case: float, repeats: int, sizes: list[str]) -> list[Row]:
    """One row per group size; each rate is the median of ``repeats`` runs (a shared VM swings
    by ±15-25% from one run to the next)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as store:
        server = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=Path(store), max_payload=MAX_PAYLOAD, max_pending=128 * MiB
            )
        )
        url = server.start()
        try:
            for case in sizes:
                target = SIZES[case]
                # Small groups: enough messages for a steady state (256 took ~0.1 s, noisy).
                count = max(3, min(1024, int(seconds_per_case * 150 * MiB) // target))
                rollouts = build_rollouts(target, count)
                logical = [experience_bytes(r) for r in rollouts]
                total = sum(logical) / MiB
                wire = sum(len(encode(r).payload) for r in rollouts[:4]) / min(4, count)
                rates: list[list[float]] = []
                for attempt in range(repeats):
                    name = f"{case}-{attempt}"
                    ours = await dockyard_path(url, rollouts, name)
                    raw = await raw_path(url, logical, name)
                    transport = await dockyard_path(url, rollouts, name, codec=False)
                    seconds = (
                        await pipeline(url, rollouts, target, f"{name}-ours", raw=False),
                        await pipeline(url, rollouts, target, f"{name}-raw", raw=True),
                        ours.wall,
                        raw.wall,
                        transport.wall,
                    )
                    cpu_per_group = tuple(1e6 * t.cpu / count for t in (ours, raw, transport))
                    rates.append([*(total / s for s in seconds), *cpu_per_group])
                medians = [statistics.median(column) for column in zip(*rates, strict=True)]
                rows.append((case, count, int(wire), *medians))
                print(f"{case}: {rows[-1]}", file=sys.stderr)
        finally:
            server.stop()
    return rows


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| rollout group (uncompressed) | msgs | wire size (zstd) | pipeline: dockyard MiB/s | "
        "raw nats-py MiB/s | **ratio** | sequential: dockyard MiB/s | raw nats-py MiB/s | "
        "ratio | dockyard without the codec MiB/s | its ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, count, wire, pipe_ours, pipe_raw, ours, raw, transport, *_ in rows:
        lines.append(
            f"| {case} | {count} | {wire / MiB:.2f} MiB | {pipe_ours:.0f} | {pipe_raw:.0f} | "
            f"**{pipe_ours / pipe_raw:.2f}×** | {ours:.0f} | {raw:.0f} | {ours / raw:.2f}× | "
            f"{transport:.0f} | {transport / raw:.2f}× |"
        )
    return lines


def write_docs(body: list[str]) -> None:
    replace_section("data-plane", body)  # the weight-blob subsection stays as it is


def compare_trees(baseline: Path, rounds: int, forwarded: list[str]) -> list[str]:
    """Run this script under this tree's and ``baseline``'s ``PYTHONPATH`` in turn, ``rounds``
    times (the order alternating, so a load that drifts over the run blurs both alike), and
    table the medians of each tree's ratios to raw nats-py measured in the same run."""
    trees = {"this tree": Path(__file__).resolve().parents[1], "baseline": baseline.resolve()}
    results: dict[str, list[list[Row]]] = {name: [] for name in trees}
    for round_ in range(rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            env = {**os.environ, "PYTHONPATH": str(trees[name])}
            done = subprocess.run(
                [sys.executable, __file__, "--json", *forwarded],
                env=env,
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            rows: list[Row] = [tuple(row) for row in json.loads(done.stdout.splitlines()[-1])]
            results[name].append(rows)
            print(f"round {round_ + 1} {name}: {results[name][-1]}", file=sys.stderr)
    lines = [
        "| group | tree | pipeline ratio (each round) | median | sequential ratio (each round) "
        "| median | client CPU µs/group: dockyard | raw nats-py | CPU ratio raw/dockyard "
        "| dockyard without the codec |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for index, case in enumerate(row[0] for row in results["this tree"][0]):
        for name in trees:
            rows = [run_rows[index] for run_rows in results[name]]
            pipe = [row[3] / row[4] for row in rows]
            seq = [row[5] / row[6] for row in rows]
            ours_cpu = statistics.median(row[8] for row in rows)
            raw_cpu = statistics.median(row[9] for row in rows)
            transport_cpu = statistics.median(row[10] for row in rows)
            lines.append(
                f"| {case} | {name} | {', '.join(f'{r:.2f}' for r in pipe)} | "
                f"**{statistics.median(pipe):.2f}×** | {', '.join(f'{r:.2f}' for r in seq)} | "
                f"**{statistics.median(seq):.2f}×** | {ours_cpu:.0f} | {raw_cpu:.0f} | "
                f"{raw_cpu / ours_cpu:.2f}× | {transport_cpu:.0f} |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-case", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=1, help="runs per size (medians)")
    parser.add_argument(
        "--sizes", nargs="+", choices=list(SIZES), default=list(SIZES), help="group sizes to run"
    )
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="another dockyard checkout to compare with in the same run (its PYTHONPATH root)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline-tree: runs per tree")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # compare_trees
    args = parser.parse_args()
    if args.baseline_tree is not None:
        forwarded = ["--seconds-per-case", str(args.seconds_per_case), "--repeats"]
        forwarded += [str(args.repeats), "--sizes", *args.sizes]
        print("\n".join(compare_trees(args.baseline_tree, args.rounds, forwarded)))
        return 0
    rows = asyncio.run(run(args.seconds_per_case, args.repeats, args.sizes))
    if args.json:
        print(json.dumps(rows))
        return 0
    lines = table(rows)
    print("\n".join(lines))
    if args.write_docs:
        body = [
            "## Data plane",
            "",
            f"`python benchmarks/bench_data_plane.py --seconds-per-case "
            f"{args.seconds_per_case:g} --repeats {args.repeats} --write-docs` ({date.today()}, "
            "2-core VM, embedded nats-server 2.15 on loopback, file store). Publish → stream → "
            "pull → decode → ack of ScoredRollout groups, against raw nats-py publish/fetch of "
            "opaque random bytes as large as the groups' uncompressed arrays (both pipelined "
            "in windows of 32 publishes and at most 64 MiB), same run, same server. Dockyard's "
            "time includes encoding and decoding. *Pipeline*: a producer process publishes "
            "while the consumer process pulls (the deployment's shape, and what the target is "
            "about: experience per second through the pipeline); *sequential*: one process "
            "publishes everything, then consumes it (every stage on one core in turn: the CPU "
            f"cost per group). Medians of {args.repeats} runs. Target: ratio ≥ 1.0.",
            "",
            *lines,
            "",
            "Reading: every size meets the target in the pipeline, the deployment's shape. "
            "64 KiB groups (16 samples of ≈ 240 tokens, ≈ 21 KB on the wire) measured "
            "1.04-1.17× in nine runs on 2026-12-01, the table's among them (0.78-1.00× before "
            "that day's work on the per-message CPU, which took dockyard's 64 KiB pipeline from "
            "≈ 305 to ≈ 355 MiB/s; the previous commit as the baseline, alternating on the same "
            "machine). Sequentially they stay below raw nats-py, ≈ 0.76×: one process pays for "
            "every stage in turn, so nothing hides the codec's CPU, and what compression buys "
            "(a quarter of the bytes for the server to store and the wire to carry) saves less "
            "time than the codec costs on loopback. The "
            "transport is not the limit: without the codec (payloads encoded beforehand, not "
            "decoded; last two columns) dockyard moves them ≈ 2× faster than raw nats-py. "
            "Measured per 64 KiB group in the pipeline: dockyard's producer spends ≈ 0.14 ms of "
            "CPU (encoding ≈ 0.085 of it in a tight loop: zstd of the 20 KB that are compressed "
            "≈ 0.03, laying out and packing the metadata ≈ 0.03), its consumer ≈ 0.16 ms "
            "(decoding ≈ 0.085: zstd ≈ 0.017, msgspec ≈ 0.011, assembling the group's models — "
            "9, plus one per segment — and checking its arrays ≈ 0.045) and the server ≈ "
            "0.09-0.15 ms, against ≈ 0.06, ≈ 0.25 and ≈ 0.2-0.27 ms for raw nats-py (whose "
            "server stores and sends 4× the bytes, and whose consumer copies them through "
            "nats-py's parser). What that round changed, each step measured: the envelope is "
            "scanned by one msgspec pass (was a msgpack Unpacker walk: 9 → 4 µs), exact string "
            "patterns (group ids, score flags) are checked by msgspec (was a pydantic call "
            "each), the models' readers build every field in one dict display, decoded structs "
            "are not tracked by the GC, the current schema version is recognised without "
            "parsing (decoding 106 → 85 µs); nats-py's header parser (a generator over every "
            "character of every name, a tenth of a consumer's transport time) is replaced by "
            "one regular expression per name, and pull deliveries are taken from the "
            "subscription's own queue (one asyncio queue and task switch less per message). "
            "Measured and not kept: uvloop (raw nats-py gains more from it), overlapping a "
            "window's encoding with the previous window's acks, freezing the prebuilt inputs "
            "out of the GC, handing the packer plain models as dicts rather than through its "
            "hook (the Python pass costs what the hook did), zstd parameters other than level "
            "1's (none is faster at the same ratio; level -1 saves ≈ 6 µs per 64 KiB group for "
            "4% more bytes). Rows swing by ±15-25% between runs (a shared VM; raw nats-py's "
            "pipeline also has a slow mode, ≈ 130-190 MiB/s, where its server is the limit); "
            "compare ratios, not MiB/s.",
            "",
        ]
        write_docs(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
