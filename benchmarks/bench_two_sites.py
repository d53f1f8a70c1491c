"""Time for a weight version to reach every rollout worker at a remote site: full vs patch.

Two real nats-servers, site A (trainer) and site B (rollout workers), B a leaf node of A with
its own JetStream domain, provisioned by dockyard's ``data_plane.site`` (B mirrors A's weight
streams). Between them the WAN is the userspace link of ``tests/wan_proxy.py`` capped at
``--mbit`` per direction with ``--delay-ms`` one-way latency (this kernel has no netem; the cap
is paced in the proxy, not by ``tc``). The weights are a bf16 Qwen2-style model (built in code,
``bench_weight_patches.build_model``) after one AdamW step at lr 1e-6; the version is published
once as the full safetensors blob (the baseline, measured in the same run) and once as the
lossless patch on the previous version. Measured: from the trainer's ``put`` until every one of
``--workers`` workers at B holds the bytes (read from B's mirror), and the bytes that crossed.

    python benchmarks/bench_two_sites.py [--mbit 100] [--delay-ms 20] [--workers 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from bench_weight_patches import build_model, grpo_like_step, published
from report import replace_section

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.sites import hub_leafnodes, leaf_remote
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.broker.weight_blobs.base import tensors_to_bytes
from dockyard.broker.weight_blobs.patch import ChainLink, PatchHeader, encode_patch, state_digest
from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.wan_proxy import WanLink

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(url: str, site: dict[str, object]) -> DataPlaneConfig:
    return DataPlaneConfig.model_validate(
        {
            "url": url,
            "namespace": "bench",
            "site": site,
            "streams": {"max_bytes": 2048 * MiB},
            "publish": {"timeout_s": 120.0},
            "weight_transport": {"chunk_size": 4 * MiB, "fetch_stall_timeout_s": 600.0},
        }
    )


def weight_blobs(seed: int) -> tuple[bytes, bytes, int]:
    """The full bf16 snapshot after one lr-1e-6 step, the patch on the step before, params."""
    model = build_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    base = published(model)
    grpo_like_step(model, optimizer, torch.Generator().manual_seed(seed))
    new = published(model)
    header = PatchHeader(
        1, 0, state_digest(base), state_digest(new), ChainLink(0, "sha256:" + "0" * 64, 0)
    )
    patch, _ = encode_patch(base, new, header)
    return tensors_to_bytes(new), patch, sum(p.numel() for p in model.parameters())


async def time_to_every_worker(
    trainer: JetStreamPlane, workers: list[JetStreamPlane], link: WanLink, blob: bytes, version: int
) -> tuple[float, int]:
    store = create_weight_store(trainer, reader_id="trainer")
    before = link.counters.to_downstream
    started = time.perf_counter()
    ref = await store.put(version, blob)
    got = await asyncio.gather(
        *(create_weight_store(w, reader_id=f"w{i}").get_bytes(ref) for i, w in enumerate(workers))
    )
    seconds = time.perf_counter() - started
    assert all(copy == blob for copy in got)
    return seconds, link.counters.to_downstream - before


async def measure(args: argparse.Namespace, full: bytes, patch: bytes) -> dict[str, float]:
    store = Path(tempfile.mkdtemp(prefix="bench-two-sites-"))
    leaf_port = _free_port()
    hub = EmbeddedNatsServer(
        EmbeddedServerSettings(
            store_dir=store / "a",
            max_payload=8 * MiB,
            jetstream_extra={"domain": "a"},
            extra={"server_name": "a", "leafnodes": hub_leafnodes(f"127.0.0.1:{leaf_port}")},
        )
    )
    hub.start()
    link = WanLink(
        "127.0.0.1",
        leaf_port,
        delay_s=args.delay_ms / 1000,
        rate_bytes_per_s=args.mbit * 1e6 / 8,
    )
    await link.start()
    leaf = EmbeddedNatsServer(
        EmbeddedServerSettings(
            store_dir=store / "b",
            max_payload=8 * MiB,
            jetstream_extra={"domain": "b"},
            extra={
                "server_name": "b",
                "leafnodes": leaf_remote(f"nats://127.0.0.1:{link.port}", "bench"),
            },
        )
    )
    leaf.start()
    planes: list[JetStreamPlane] = []
    try:
        await link.wait_connected()
        rollout_site = {"domain": "b", "trainer_domain": "a"}
        workers = [JetStreamPlane(_config(leaf.url, rollout_site)) for _ in range(args.workers)]
        trainer = JetStreamPlane(_config(hub.url, {"domain": "a", "rollout_domains": ["b"]}))
        planes = [*workers, trainer]
        for plane in planes:
            await plane.start()
        full_s, full_crossed = await time_to_every_worker(trainer, workers, link, full, 1)
        patch_s, patch_crossed = await time_to_every_worker(trainer, workers, link, patch, 2)
    finally:
        for plane in planes:
            await plane.close()
        await link.close()
        leaf.kill()
        hub.kill()
    return {
        "full_bytes": len(full),
        "patch_bytes": len(patch),
        "full_s": full_s,
        "patch_s": patch_s,
        "full_crossed": full_crossed,
        "patch_crossed": patch_crossed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    full, patch, params = weight_blobs(args.seed)
    r = asyncio.run(measure(args, full, patch))
    wire_s = r["full_bytes"] * 8 / (args.mbit * 1e6)
    lines = [
        "| version as | blob bytes | bytes across the link | to every worker s | "
        "full ÷ this (time) |",
        "|---|---:|---:|---:|---:|",
        f"| full snapshot (baseline) | {r['full_bytes']:,} | {r['full_crossed']:,} | "
        f"{r['full_s']:.2f} | 1× |",
        f"| patch on the previous version | {r['patch_bytes']:,} | {r['patch_crossed']:,} | "
        f"{r['patch_s']:.2f} | {r['full_s'] / r['patch_s']:.0f}× |",
    ]
    print("\n".join(lines))
    print(f"(the full blob alone needs {wire_s:.1f} s on a {args.mbit:g} Mbit/s wire)")
    if args.write_docs:
        replace_section(
            "two-sites",
            [
                "## Two sites: a weight version to every remote worker",
                "",
                f"Measured {date.today().isoformat()} on this machine (2 shared CPU cores), "
                f"`python benchmarks/bench_two_sites.py --mbit {args.mbit:g} --delay-ms "
                f"{args.delay_ms:g} --workers {args.workers} --write-docs`: site A and site B "
                "are two nats-servers (B a leaf node of A, `data_plane.site`: B mirrors A's "
                "weight streams), joined by the userspace link of `tests/wan_proxy.py` capped "
                f"at {args.mbit:g} Mbit/s per direction with {args.delay_ms:g} ms one-way "
                f"latency. Weights: a bf16 Qwen2-style model of {params / 1e6:.0f}M "
                "parameters after one AdamW step at lr 1e-6. Timed from the trainer's `put` "
                f"at A until all {args.workers} workers at B hold the bytes (read from B's "
                "mirror, digest-checked); the baseline is the full snapshot in the same run.",
                "",
                *lines,
                "",
                "Reading: the bytes across the link are about one copy of the blob, not one "
                "per worker (B's mirror is read by all of them). The patch's time is bounded "
                "below by the mirror's start-up and the round trips, not the bandwidth; the "
                "full snapshot's by the wire. The cap is paced in the proxy (this kernel has "
                "no netem); `tc tbf` in network namespaces was not used.",
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
