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

Then a pipelined run per mode (full snapshots, then patches), each on fresh servers, by
dockyard's rules: the trainer at A keeps ``(--max-age + 1) × --batch`` prompt groups in flight,
each stamped with the version current when it was dispatched (they cross to B by B's prompt
feed); a worker at B takes one group at a time, waits for weights at least that new for at
most ``--max-refit-wait-s`` (then generates with its own), and publishes the scored group of
``--group-kib`` KiB at B (sourced to A); the trainer takes ``--batch`` groups a step, drops
one older than ``--max-age`` versions, trains and puts the next version; each worker fetches
every new version as soon as its event is at B, overlapping generation. Measured: trained
groups per second, experience bytes across the link per second, the fraction of the trainer's
wall time spent waiting for groups, and each version's arrival at every worker. Stand-ins,
named: generating a group and the training step are fixed waits (``--gen-s``, ``--train-s``;
this machine has no accelerator), and workers move a version's bytes without applying them
(apply times are in the "Weight patches" section).

With ``--link netns`` (root) the link is a kernel one instead: site A's server in network
namespace A, B's in namespace B, a veth between them shaped by ``tc tbf`` at ``--mbit`` on both
ends (``tests/netns_link.py``; no added latency, this kernel has no netem).

    python benchmarks/bench_two_sites.py [--link proxy|netns] [--mbit 100] [--delay-ms 20]
        [--workers 3] [--steps 5] [--batch 4] [--gen-s 1.0] [--train-s 2.0] [--group-kib 64]
        [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import torch
from bench_weight_patches import build_model, grpo_like_step, published
from report import replace_section

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.sites import hub_leafnodes, leaf_remote
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.broker.weight_blobs.base import BlobRef, tensors_to_bytes
from dockyard.broker.weight_blobs.patch import ChainLink, PatchHeader, encode_patch, state_digest
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.planning.fleet import FleetSpec, PipelineRules, Prediction, StageCosts
from dockyard.planning.simulator import simulate
from dockyard.utils.logging import get_logger
from tests.netns_link import NetnsSites, leaf_connected, netns_unavailable
from tests.wan_proxy import SiteLink, WanLink

log = get_logger("bench_two_sites")

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(url: str, site: Mapping[str, object]) -> DataPlaneConfig:
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
    trainer: JetStreamPlane,
    workers: list[JetStreamPlane],
    link: SiteLink,
    blob: bytes,
    version: int,
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


@dataclass
class RunResult:
    """One pipelined run (full snapshots or patches) across the link."""

    mode: str
    wall_s: float = 0.0
    trainer_wait_s: float = 0.0
    groups: int = 0
    dropped_stale: int = 0  # groups older than the staleness bound when they arrived
    up_bytes: int = 0  # B -> A: experience (and the sources' acks)
    down_bytes: int = 0  # A -> B: weights (and prompts, API answers)
    arrival_s: list[float] = field(default_factory=list)  # per version: put -> every worker
    #: Per step: its wait for groups, when it ended (from the run's start), putting its version.
    step_waits: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    put_s: list[float] = field(default_factory=list)

    @property
    def steady_idle(self) -> float:
        """Idle fraction from the end of the first step to the end of the last (the
        simulator's steady state, ``dockyard simulate``)."""
        return sum(self.step_waits[1:]) / (self.step_ends[-1] - self.step_ends[0])


def _version_blob(blob: bytes, version: int) -> bytes:
    """``blob`` made unique to ``version`` (same size): the blob store is content-addressed,
    so the same bytes put twice would not cross the link again."""
    return blob[:-8] + version.to_bytes(8, "little")


HEADER_VERSION = "Bench-Behaviour-Version"


class _Worker:
    """A rollout worker at B, by dockyard's rules: it fetches each new version as soon as its
    event is at B (overlapping generation), takes one prompt group at a time from B's queue,
    and generates it with weights at least as new as the version it was dispatched at, waiting
    for them at most ``--max-refit-wait-s`` (``RolloutWorker``'s ``max_refit_wait_s``)."""

    def __init__(self, plane: JetStreamPlane, name: str, refs: dict[int, BlobRef]) -> None:
        self.plane, self.name, self.refs = plane, name, refs
        self.store = create_weight_store(plane, reader_id=name)
        self.held = 0
        self.held_at: dict[int, float] = {}
        self.changed = asyncio.Event()

    async def follow(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            event = await self.plane.current_weight_event()
            newest = int(event.data) if event is not None else 0
            if newest > self.held:
                started = time.perf_counter()
                await self.store.get_bytes(self.refs[newest])
                self.held, self.held_at[newest] = newest, time.perf_counter()
                log.info(
                    "bench.fetched",
                    worker=self.name,
                    version=newest,
                    seconds=round(self.held_at[newest] - started, 2),
                )
                self.changed.set()
            else:
                await asyncio.sleep(0.02)  # polling B's weight mirror for a new event

    async def _weights_for(self, version: int, wait_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                while self.held < version:
                    self.changed.clear()
                    await self.changed.wait()

    async def generate(self, stop: asyncio.Event, args: argparse.Namespace) -> None:
        # Random bytes: the leaf connection compresses (s2), and real token ids and
        # log-probs are far from a run of one byte; random is the incompressible bound.
        names, payload = self.plane.names, os.urandom(args.group_kib * 1024)
        while not stop.is_set():
            prompts = await self.plane.fetch(names.prompt_consumer, batch=1, timeout_s=0.5)
            for prompt in prompts:
                await self._weights_for(int(prompt.data), args.max_refit_wait_s)
                await asyncio.sleep(args.gen_s)  # stand-in: generating one group
                await self.plane.publish(
                    names.scored,
                    payload,
                    msg_id=f"scored-{prompt.msg_id}",
                    headers={HEADER_VERSION: str(self.held)},
                )
                await prompt.ack()


class _Dispatcher:
    """The trainer site's prompt groups, by dockyard's rule: at most ``(max_age + 1) × batch``
    in flight, each stamped with the version current when it was dispatched."""

    def __init__(self, plane: JetStreamPlane, args: argparse.Namespace) -> None:
        self.plane, self.count = plane, 0
        self.budget: int = (args.max_age + 1) * args.batch

    async def top_up(self, in_flight: int, version: int) -> int:
        wanted = self.budget - in_flight
        messages = [
            OutgoingMessage(self.plane.names.prompts, str(version).encode(), f"p-{self.count + i}")
            for i in range(wanted)
        ]
        self.count += wanted
        await self.plane.publish_many(messages)
        return in_flight + wanted


async def pipelined_run(
    trainer: JetStreamPlane,
    planes: list[JetStreamPlane],
    link: SiteLink,
    blob: bytes,
    args: argparse.Namespace,
    mode: str,
) -> RunResult:
    version = 1
    refs: dict[int, BlobRef] = {}
    store = create_weight_store(trainer, reader_id="trainer")
    workers = [_Worker(p, f"w{i}", refs) for i, p in enumerate(planes)]
    refs[version] = await store.put(version, _version_blob(blob, version))
    await trainer.publish(trainer.names.weight_events, b"1", msg_id="weights-1")
    # The mirror copies every blob, read or not: start once the first version is at B, so it
    # is not still on the wire ahead of the run's first new version.
    await asyncio.gather(*(w.store.get_bytes(refs[version]) for w in workers))
    for worker in workers:
        worker.held = version
    result = RunResult(mode)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w.follow(stop)) for w in workers]
    tasks += [asyncio.create_task(w.generate(stop, args)) for w in workers]
    dispatcher = _Dispatcher(trainer, args)
    up, down = link.counters.to_upstream, link.counters.to_downstream
    put_at: dict[int, float] = {}
    started = time.perf_counter()
    in_flight = await dispatcher.top_up(0, version)
    try:
        for step in range(1, args.steps + 1):
            waited, fresh = time.perf_counter(), 0
            while fresh < args.batch:
                for group in await trainer.fetch(
                    trainer.names.scored_consumer, batch=args.batch - fresh, timeout_s=1.0
                ):
                    in_flight -= 1
                    if version - int(group.headers[HEADER_VERSION]) > args.max_age:
                        result.dropped_stale += 1  # as the trainer drops a too-old group
                    else:
                        fresh += 1
                    await group.ack()
                # A dropped group leaves the budget: the dispatcher replaces it at once.
                in_flight = await dispatcher.top_up(in_flight + fresh, version) - fresh
            result.trainer_wait_s += time.perf_counter() - waited
            result.step_waits.append(time.perf_counter() - waited)
            log.info(
                "bench.step", mode=mode, step=step, waited_s=round(time.perf_counter() - waited, 2)
            )
            result.groups += fresh
            await asyncio.sleep(args.train_s)  # stand-in: the training step's compute
            version += 1
            put_at[version] = time.perf_counter()
            refs[version] = await store.put(version, _version_blob(blob, version))
            await trainer.publish(
                trainer.names.weight_events, str(version).encode(), msg_id=f"weights-{version}"
            )
            result.put_s.append(time.perf_counter() - put_at[version])
            in_flight = await dispatcher.top_up(in_flight, version)
            result.step_ends.append(time.perf_counter() - started)
        result.wall_s = time.perf_counter() - started
        result.up_bytes = link.counters.to_upstream - up
        while not all(w.held >= version for w in workers):  # every version's arrival
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            if failed:
                raise RuntimeError("a worker failed") from failed[0].exception()
            await asyncio.sleep(0.05)  # polling the workers' state, not a synchronisation
        result.down_bytes = link.counters.to_downstream - down
    finally:
        stop.set()
        for worker in workers:
            worker.changed.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    for v, at in put_at.items():
        held = [min(t for w_v, t in w.held_at.items() if w_v >= v) for w in workers]
        result.arrival_s.append(max(held) - at)
    return result


@contextlib.asynccontextmanager
async def proxy_sites(
    args: argparse.Namespace, store: Path
) -> AsyncIterator[tuple[str, str, SiteLink]]:
    """Servers A and B on loopback, B's leaf connection through the userspace proxy."""
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
    try:
        await link.wait_connected()
        yield hub.url, leaf.url, link
    finally:
        await link.close()
        leaf.kill()
        hub.kill()


@contextlib.asynccontextmanager
async def netns_sites(
    args: argparse.Namespace, store: Path
) -> AsyncIterator[tuple[str, str, SiteLink]]:
    """Server A in network namespace A, B in namespace B, B's leaf connection across a veth
    shaped by ``tc tbf`` at ``--mbit`` on both ends (``tests/netns_link.py``)."""
    with NetnsSites(rate_mbit=args.mbit) as link:
        hub = link.start_site("a", store / "a", "bench")
        leaf = link.start_site("b", store / "b", "bench")
        await leaf_connected(hub)
        yield hub.url, leaf.url, link


@contextlib.asynccontextmanager
async def two_sites(
    args: argparse.Namespace,
) -> AsyncIterator[tuple[JetStreamPlane, list[JetStreamPlane], SiteLink]]:
    """Fresh servers A and B joined by a capped link (``--link``), the trainer's plane at A
    and the workers' at B (every measurement starts from empty streams)."""
    store = Path(tempfile.mkdtemp(prefix="bench-two-sites-"))
    sites = netns_sites if args.link == "netns" else proxy_sites
    planes: list[JetStreamPlane] = []
    try:
        async with sites(args, store) as (hub_url, leaf_url, link):
            rollout_site = {"domain": "b", "trainer_domain": "a"}
            workers = [JetStreamPlane(_config(leaf_url, rollout_site)) for _ in range(args.workers)]
            trainer = JetStreamPlane(_config(hub_url, {"domain": "a", "rollout_domains": ["b"]}))
            planes = [*workers, trainer]
            try:
                for plane in planes:
                    await plane.start()
                yield trainer, workers, link
            finally:
                for plane in planes:
                    await plane.close()
    finally:
        shutil.rmtree(store, ignore_errors=True)  # gigabytes of blobs


async def measure(
    args: argparse.Namespace, full: bytes, patch: bytes
) -> tuple[dict[str, float], list[RunResult]]:
    async with two_sites(args) as (trainer, workers, link):
        full_s, full_crossed = await time_to_every_worker(trainer, workers, link, full, 1)
        patch_s, patch_crossed = await time_to_every_worker(trainer, workers, link, patch, 2)
    runs: list[RunResult] = []
    for blob, mode in ((full, "full"), (patch, "patch")) if args.steps else ():
        async with two_sites(args) as (trainer, workers, link):
            runs.append(await pipelined_run(trainer, workers, link, blob, args, mode))
    return {
        "full_bytes": len(full),
        "patch_bytes": len(patch),
        "full_s": full_s,
        "patch_s": patch_s,
        "full_crossed": full_crossed,
        "patch_crossed": patch_crossed,
    }, runs


def median_arrival(run: RunResult) -> float:
    return sorted(run.arrival_s)[len(run.arrival_s) // 2]


def run_table(runs: list[RunResult]) -> list[str]:
    """The pipelined runs side by side; the full-snapshot run is the baseline."""
    lines = [
        "| weights as | steps s | trained groups/s | dropped stale | experience MB/s across | "
        "trainer idle (steady) | put a version at A s | version to every worker s "
        "(median, max) | weight MB across | ÷ full (groups/s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = runs[0].groups / runs[0].wall_s
    for r in runs:
        rate = r.groups / r.wall_s
        lines.append(
            f"| {r.mode} | {r.wall_s:.1f} | {rate:.2f} | {r.dropped_stale} | "
            f"{r.up_bytes / r.wall_s / 1e6:.3f} | {r.trainer_wait_s / r.wall_s:.0%} "
            f"({r.steady_idle:.0%}) | {sum(r.put_s) / len(r.put_s):.2f} | "
            f"{median_arrival(r):.2f}, {max(r.arrival_s):.2f} | {r.down_bytes / 1e6:,.1f} | "
            f"{rate / base:.1f}× |"
        )
    return lines


def simulated(
    args: argparse.Namespace, run: RunResult, blob_bytes: int, full_bytes: int, local_s: float
) -> Prediction:
    """``dockyard simulate``'s prediction for one pipelined run: the rules and fleet of the
    run, the stand-ins' fixed costs, the version put time measured in the run, and the site-
    local part of a version's arrival (``refit_s``) from the arrival measurement."""
    rules = PipelineRules(
        num_prompts_per_step=args.batch,
        async_enabled=True,
        max_age=args.max_age,
        fetch_batch=1,  # one group at a time
        steps=args.steps,
        patches=blob_bytes < full_bytes,
        snapshot_every=10**9,  # the run sends no snapshot after the first version
        max_refit_wait_s=args.max_refit_wait_s,
    )
    costs = StageCosts(
        gen_group_s=args.gen_s,
        gen_batch_s=0.0,
        train_step_s=args.train_s,
        publish_s=sum(run.put_s) / len(run.put_s),
        step_overhead_s=0.0,
        score_s=0.0,  # the workers publish scored groups themselves
        refit_s=local_s,
        hop_s=0.0,
        weight_bytes=full_bytes,
        rollout_bytes=args.group_kib * 1024,
    )
    spec = FleetSpec(
        rules,
        costs,
        workers=args.workers,
        wan_mbit=args.mbit,
        latency_ms=args.delay_ms,
        patch_ratio=full_bytes / blob_bytes if rules.patches else None,
    )
    return simulate(spec.validated())


def simulator_table(
    args: argparse.Namespace, r: dict[str, float], runs: list[RunResult]
) -> list[str]:
    lines = [
        "| weights as | steps/s measured | predicted | error | trainer idle measured | "
        "predicted | version to every worker s, mean measured | predicted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        blob = r["full_bytes"] if run.mode == "full" else r["patch_bytes"]
        wire_s = blob * 8 / (args.mbit * 1e6) + args.delay_ms / 1000
        local_s = max(0.0, r[f"{run.mode}_s"] - wire_s)
        p = simulated(args, run, int(blob), int(r["full_bytes"]), local_s)
        steps_per_s = (len(run.step_ends) - 1) / (run.step_ends[-1] - run.step_ends[0])
        arrival = sum(run.arrival_s) / len(run.arrival_s)
        error = (p.steps_per_s - steps_per_s) / steps_per_s
        lines.append(
            f"| {run.mode} | {steps_per_s:.3f} | {p.steps_per_s:.3f} | {error:+.0%} | "
            f"{run.steady_idle:.0%} | {p.trainer_idle_fraction:.0%} | {arrival:.2f} | "
            f"{p.weight_propagation_s:.2f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=None,
        help="one-way latency of the proxy link (default 20); the netns link has none",
    )
    parser.add_argument(
        "--link",
        choices=("proxy", "netns"),
        default="proxy",
        help="proxy: the userspace link of tests/wan_proxy.py (cap paced in the proxy); "
        "netns: each site in a network namespace, a veth capped by tc tbf (needs root)",
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5, help="pipelined steps per mode; 0: none")
    parser.add_argument("--batch", type=int, default=4, help="groups per trainer step")
    parser.add_argument("--gen-s", type=float, default=1.0, help="one group's generation")
    parser.add_argument("--train-s", type=float, default=2.0, help="one training step")
    parser.add_argument("--group-kib", type=int, default=64, help="one scored group's size")
    parser.add_argument("--max-age", type=int, default=1, help="staleness bound, versions")
    parser.add_argument(
        "--max-refit-wait-s",
        type=float,
        default=10.0,
        help="a worker waits this long for its group's version, then generates with its own",
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.link == "netns":
        reason = netns_unavailable()
        if reason is not None:
            parser.error(f"--link netns: {reason}")
        if args.delay_ms:  # a kernel delay needs netem, which this kernel lacks
            parser.error("--delay-ms: the netns link has no delay (this kernel has no netem)")
        args.delay_ms = 0.0
    elif args.delay_ms is None:
        args.delay_ms = 20.0
    full, patch, params = weight_blobs(args.seed)
    r, runs = asyncio.run(measure(args, full, patch))
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
    pipelined = run_table(runs) if runs else []
    print("\n".join(pipelined))
    predicted = simulator_table(args, r, runs) if runs else []
    print("\n".join(predicted))
    if args.write_docs and args.link == "netns":
        replace_section(
            "two-sites",
            [
                f"### Over a kernel link: network namespaces and `tc tbf` ({args.mbit:g} Mbit/s)",
                "",
                f"Measured {date.today().isoformat()}, `python benchmarks/bench_two_sites.py "
                f"--link netns --mbit {args.mbit:g} --workers {args.workers} --steps 0 "
                "--write-docs` (as root): the same measurement, but site A's nats-server runs "
                "in network namespace A and site B's in namespace B, and B's leaf connection "
                f"crosses a veth pair shaped by `tc qdisc ... tbf rate {args.mbit:g}mbit` on "
                "both ends (`tests/netns_link.py`; the recipe is in docs/operations.md). No "
                "added latency (no netem here). Bytes across are what the veth sent A → B: IP "
                "packets, headers included.",
                "",
                *lines,
                "",
                "Reading: one copy crosses for all the workers here too (the veth's count is "
                "the blob plus headers and API traffic). With the kernel doing the shaping and "
                f"no proxy in the path, the full snapshot took {r['full_s'] / wire_s:.2f}× its "
                f"wire time ({wire_s:.1f} s); the rest is the mirror's writes at B and the "
                f"reads on this loaded machine. The patch needs {r['patch_s']:.2f} s, "
                f"{r['full_s'] / r['patch_s']:.0f}× less.",
            ],
            subsection="### Over a kernel link: network namespaces and `tc tbf`",
        )
    elif args.write_docs:
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
                f"full snapshot's by the wire ({wire_s:.1f} s alone; the rest is this loaded "
                "machine: the userspace link, the mirror's writes, the reads at B). The cap "
                "is paced in the proxy here; the same measurement across a veth capped by "
                "`tc tbf` between network namespaces is in the subsection below "
                "(`--link netns`).",
            ],
        )
    if args.write_docs and runs and args.link == "proxy":
        replace_section(
            "two-sites",
            [
                "### Experience across the link and trainer idle time",
                "",
                f"The same run, then a pipelined run per mode on fresh servers, by dockyard's "
                f"rules: {args.steps} trainer steps of {args.batch} groups, "
                f"{(args.max_age + 1) * args.batch} groups in flight (staleness bound "
                f"{args.max_age} version), {args.workers} workers at B taking one group at a "
                f"time, each waiting up to {args.max_refit_wait_s:g} s for the version its "
                f"group was dispatched at; {args.group_kib} KiB per scored group (random "
                "bytes: the leaf connection compresses). Stand-ins: generating a group is a "
                f"{args.gen_s:g} s wait and a training step a {args.train_s:g} s wait (no "
                "accelerator here); workers fetch each version's bytes from B's mirror as soon "
                "as its event is at B and do not apply them. Trainer idle = time waiting for a "
                "batch ÷ wall time of the steps (putting a version at A counts as busy); "
                "(steady): from the end of the first step to the end of the last. The "
                "full-snapshot run is the baseline, measured in the same process.",
                "",
                *pipelined,
                "",
                "Reading: experience crosses the link B → A and weights A → B; the link is "
                "full-duplex, so full snapshots do not slow the experience bytes on the wire. "
                "They slow the workers: a group dispatched at version v waits at B until v has "
                "crossed (or the refit wait runs out and it is generated with older weights, "
                "and then may arrive too old and be dropped), so with full snapshots each step "
                "waits on the wire and the trainer idles; with patches a version lands within "
                "a step and the pipeline is bound by generation and training.",
                "",
            ],
            subsection="### Experience across the link and trainer idle time",
        )
        replace_section(
            "two-sites",
            [
                "### The fleet simulator against these runs",
                "",
                "`dockyard simulate`'s model (`dockyard/planning/simulator.py`) given each "
                "pipelined run's rules and fleet (one rollout site, the link's rate and "
                "latency, the patch ratio), the stand-ins' fixed costs, the mean time to put a "
                "version at A measured in the run, and as `refit_s` the site-local part of a "
                "version's arrival: the arrival measured above less the wire time. Steps/s and "
                "idle are over the steady state (end of the first step to end of the last), "
                "as the simulator reports them; the error is predicted ÷ measured − 1.",
                "",
                *predicted,
                "",
                "Reading: `refit_s` comes from one arrival measurement (the first table: "
                f"{r['full_s']:.1f} s for the full snapshot), while the pipelined run's "
                f"versions arrived in {median_arrival(runs[0]):.1f} s (median): on this "
                "shared machine one 245 MB measurement carries the load of its moment, and "
                "the full row's prediction inherits it. The simulator also ships a version "
                "only after its put ends, while B's mirror copies it as it is stored.",
            ],
            subsection="### The fleet simulator against these runs",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
