"""End-to-end experience throughput over JetStream vs raw nats-py bytes of the same size.

Dockyard path: encode a ScoredRollout (codec: msgpack + zstd) → ``JetStreamPlane.publish`` (one
message, or chunks by reference above the payload cap) → durable pull ``fetch`` → ``decode`` →
ack. Baseline: raw nats-py ``js.publish`` of opaque random bytes as large as the rollout's
uncompressed arrays (split into ≤ max-payload messages where needed), ``fetch`` + ack, measured
in the same run against the same embedded server. Throughput counts *uncompressed experience
bytes* (the producer's arrays) per second; the ratio is dockyard / raw.

    python benchmarks/bench_data_plane.py [--seconds-per-case 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
from corpus import load_corpus, make_scored_rollout
from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import OutgoingMessage
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import ScoredRollout, decode, encode

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
    return DataPlaneConfig(
        url=url,
        namespace=namespace,
        max_payload=MAX_PAYLOAD,
        streams={"max_bytes": -1},
        consumer={"fetch_batch": 16, "ack_wait_s": 120},
        publish={"timeout_s": 60},
    )


async def dockyard_path(
    url: str, rollouts: list[ScoredRollout], case: str, *, codec: bool = True
) -> float:
    """Seconds to move ``rollouts`` through the plane; ``codec=False`` moves payloads encoded
    beforehand and skips decoding (the transport's share of the time, for the reading)."""
    config = plane_config(url, f"bench{abs(hash((case, codec))) % 10**8}")
    encoded_before = [] if codec else [encode(rollout) for rollout in rollouts]
    async with JetStreamPlane(config) as plane:
        names = plane.names
        started = time.perf_counter()
        window: list[OutgoingMessage] = []
        for index, rollout in enumerate(rollouts):  # a producer pipelines its publishes
            encoded = encode(rollout) if codec else encoded_before[index]
            headers = dict(encoded.headers)
            msg_id = headers.pop("Nats-Msg-Id")
            window.append(OutgoingMessage(names.scored, encoded.payload, msg_id, headers))
            if len(window) == 32:
                await plane.publish_many(window)
                window.clear()
        await plane.publish_many(window)
        received = 0
        while received < len(rollouts):
            for delivery in await plane.fetch(names.scored_consumer, timeout_s=5):
                if codec:
                    decode(delivery.headers, delivery.data, expected=ScoredRollout)
                await delivery.ack()
                received += 1
        return time.perf_counter() - started


async def raw_path(url: str, sizes: list[int], case: str) -> float:
    import nats
    from nats.js import api

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=60)
    stream, subject = f"raw{abs(hash(case)) % 10**8}", f"raw.{abs(hash(case)) % 10**8}"
    await js.add_stream(api.StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(stream, api.ConsumerConfig(durable_name="c", ack_wait=120))
    sub = await js.pull_subscribe_bind("c", stream=stream)
    piece = MAX_PAYLOAD - 64 * 1024
    blobs = [os.urandom(min(size, piece)) for size in sizes]  # random: raw bytes do not shrink
    messages: list[bytes] = []
    for size, blob in zip(sizes, blobs, strict=True):
        messages += [blob] * -(-size // piece)
    # The same pipelining as the plane's defaults: 32 messages, at most 64 MiB in flight (past
    # the server's 128 MB ingest buffer it refuses with 429, which nats-py never reports).
    window = max(1, min(32, (64 * MiB) // max(len(m) for m in messages)))
    started = time.perf_counter()
    for start in range(0, len(messages), window):
        futures = [
            await js.publish_async(subject, message, headers={"Nats-Msg-Id": f"{case}{index}"})
            for index, message in enumerate(messages[start : start + window], start)
        ]
        await asyncio.wait_for(asyncio.gather(*futures), timeout=120)
    received = 0
    # batch × size stays under max_pending (nats notes: larger batches get disconnected)
    batch = max(1, min(16, (32 * MiB) // max(len(m) for m in messages)))
    while received < len(messages):
        try:
            msgs = await sub.fetch(batch, timeout=5)
        except TimeoutError:
            continue
        for msg in msgs:
            await msg.ack()
            received += 1
    elapsed = time.perf_counter() - started
    await nc.close()
    return elapsed


Row = tuple[str, int, int, float, float, float]


async def run(seconds_per_case: float) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as store:
        server = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=Path(store), max_payload=MAX_PAYLOAD, max_pending=128 * MiB
            )
        )
        url = server.start()
        try:
            for case, target in SIZES.items():
                # Small groups: enough messages for a steady state (256 took ~0.1 s, noisy).
                count = max(3, min(1024, int(seconds_per_case * 150 * MiB) // target))
                rollouts = build_rollouts(target, count)
                logical = [experience_bytes(r) for r in rollouts]
                wire = sum(len(encode(r).payload) for r in rollouts[:4]) / min(4, count)
                raw_s = await raw_path(url, logical, case)
                ours_s = await dockyard_path(url, rollouts, case)
                transport_s = await dockyard_path(url, rollouts, case, codec=False)
                total = sum(logical)
                rows.append(
                    (
                        case,
                        count,
                        int(wire),
                        total / ours_s / MiB,
                        total / raw_s / MiB,
                        total / transport_s / MiB,
                    )
                )
                print(f"{case}: {rows[-1]}", file=sys.stderr)
        finally:
            server.stop()
    return rows


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| rollout group (uncompressed) | msgs | wire size (zstd) | dockyard MiB/s | "
        "raw nats-py MiB/s | ratio | dockyard without the codec MiB/s | its ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, count, wire, ours, raw, transport in rows:
        lines.append(
            f"| {case} | {count} | {wire / MiB:.2f} MiB | {ours:.0f} | {raw:.0f} | "
            f"**{ours / raw:.2f}×** | {transport:.0f} | {transport / raw:.2f}× |"
        )
    return lines


def write_docs(body: list[str]) -> None:
    replace_section("data-plane", body)  # the weight-blob subsection stays as it is


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-case", type=float, default=1.0)
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    rows = asyncio.run(run(args.seconds_per_case))
    lines = table(rows)
    print("\n".join(lines))
    if args.write_docs:
        body = [
            "## Data plane",
            "",
            f"`python benchmarks/bench_data_plane.py --write-docs` ({date.today()}, 2-core VM, "
            "embedded nats-server 2.15 on loopback, file store). Publish → stream → pull → "
            "decode → ack of ScoredRollout groups, against raw nats-py publish/fetch of "
            "opaque random bytes as large as the groups' uncompressed arrays (both pipelined "
            "in windows of 32 publishes and at most 64 MiB), same run, same server. Dockyard's "
            "time includes encoding and decoding. Target: ratio ≥ 1.0.",
            "",
            *lines,
            "",
            "Reading: from 1 MiB groups up compression pays for itself. 64 KiB groups (16 "
            "samples of ≈ 240 tokens) still miss the target. The transport is not the limit: "
            "without the codec (payloads encoded beforehand, not decoded; last two columns) "
            "dockyard moves them about twice as fast as raw nats-py, since they are a quarter "
            "of the bytes (≈ 1.5× before pipelined publishes stopped paying for a stall "
            "timeout while nats-py had a free slot: on Python 3.11 that timeout started a task "
            "per publish, ≈ 40 µs of a 21 KB publish's ≈ 110). The codec is: timed inside "
            "this benchmark, encoding takes ≈ 0.13-0.15 ms and decoding ≈ 0.16-0.18 ms per "
            "group (≈ 0.1 and 0.13 ms in a tight loop over a few groups that stay in cache), "
            "against ≈ 0.3 ms for the whole raw path of an 80 KB message. zstd is ≈ 0.05 ms "
            "of that; the rest is the ≈ 450 small values of a 16-sample group's metadata, "
            "packed and unpacked by msgpack, validated by pydantic and walked by the layout "
            "and pre-check passes. Schema 3.0 (groups carried field by field) took 64 KiB from "
            "0.38× to ≈ 0.6×, the publish fix to 0.63-0.71× (three runs); 1.0× needs the codec's "
            "per-group metadata work compiled, not a faster broker path. Producer and consumer "
            "as separate processes running at once (a prototype, not kept) gave 0.72-0.91× on "
            "this 2-core machine: the same CPU per group, shared with the server. Rows swing "
            "by ±15-25% between runs (a shared VM); compare ratios, not MiB/s.",
            "",
        ]
        write_docs(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
