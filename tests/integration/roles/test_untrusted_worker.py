"""A rollout worker generating from perturbed weights is caught by the trainer (issue #24).

Real roles on a real nats-server: the trainer (``grpo.worker_trust`` on), two rollout workers
with real torch engines and a scorer. One worker loads every weight version with noise added
(what a tampered or broken worker does: wrong weights, its log-probs still self-consistent);
the other is honest. The trainer must dead-letter every group of the tampered worker that
reaches it, with the worker id in the reason, train only the honest worker's groups, and say
so (log, Prometheus gauge, metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import HEADER_DEAD_REASON
from dockyard.commands._roles import (
    build_rollout_worker,
    build_scorer,
    build_trainer,
    create_rollout_engine,
    prepare_rollout,
    prepare_trainer,
)
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.consumers.trainer.ledger import read_trail
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import ScoredRollout, decode
from dockyard.schemas.prompt import group_id_of
from tests.integration.broker.broker_test_utils import collect
from tests.unit.trainer.test_trainer_accounting import small_config

HONEST, TAMPERED = "w-honest", "w-tampered"
STEPS = 4


def tamper(engine, relative_noise: float = 1.0) -> None:
    """Every weight version the engine loads gets Gaussian noise (as large as each tensor's std)."""
    load = engine.update_weights
    generator = torch.Generator().manual_seed(1)

    async def update_weights(version, source):
        noisy = {}
        for name, tensor in source.items():
            if tensor.is_floating_point() and tensor.numel() > 1:
                noise = torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
                tensor = tensor + noise * tensor.float().std().to(tensor.dtype) * relative_noise
            noisy[name] = tensor
        await load(version, noisy)

    engine.update_weights = update_weights


@pytest.mark.timeout(900)  # a few real steps of three roles on two shared cores
async def test_a_worker_with_perturbed_weights_is_flagged_and_its_groups_dead_lettered(
    tmp_path: Path,
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = small_config(
        "grpo.num_generations_per_prompt=4",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8",
        f"grpo.max_num_steps={STEPS}",
        "run.starvation_warning_s=30",
        "run.starvation_timeout_s=120",
        "grpo.worker_trust.enabled=true",
        "grpo.worker_trust.min_tokens=1",  # judge from a worker's first group on
    )
    # One group per fetch, so that the two workers share the work.
    plane_config = data_plane_config_factory(
        nats_server.url, consumer={"fetch_batch": 1, "ack_wait_s": 30.0}
    )
    async with JetStreamPlane(plane_config) as plane:
        trainer = build_trainer(
            config, prepare_trainer(config), plane, run_dir=tmp_path, status_dir=None
        )
        params = prepare_rollout(config)
        engines = {HONEST: create_rollout_engine(config), TAMPERED: create_rollout_engine(config)}
        tamper(engines[TAMPERED])
        workers = [
            build_rollout_worker(
                config,
                plane,
                engine,
                params,
                worker_id=worker_id,
                status=StatusFile(None, "rollout", worker_id),
            )
            for worker_id, engine in engines.items()
        ]
        scorer = build_scorer(
            config, plane, scorer_id="scorer-0", status=StatusFile(None, "scorer", "0")
        )
        roles = [asyncio.create_task(role.run()) for role in (*workers, scorer)]
        try:
            with capture_logs() as logs:
                summary = await asyncio.wait_for(trainer.run(), timeout=600)
        finally:
            for role in (*workers, scorer):
                role.stop()
            for task in roles:
                task.cancel()
            # Bounded: once in about ten runs one cancelled role task has not finished (the
            # trainer had finished its steps; the cause is not found yet, see the closing note
            # of 2026-12-04). The run's records are what this test checks; a stuck teardown is
            # reported, not waited for until the suite's timeout.
            done, stuck = await asyncio.wait(roles, timeout=60)
            if stuck:
                warnings.warn(
                    f"{len(stuck)} role task(s) did not end within 60 s of stop() and cancel(): "
                    + ", ".join(task.get_coro().__qualname__ for task in stuck),
                    stacklevel=1,
                )
            for task in done:
                with contextlib.suppress(asyncio.CancelledError):
                    task.result()

        assert summary.steps == STEPS
        scored = [
            decode(m.headers, m.data, expected=ScoredRollout)
            for m in await collect(plane, plane.names.scored)
        ]
        workers_of = {s.group_id: set(s.rollout.samples.worker_id) for s in scored}
        events = read_trail(tmp_path / "ledger.jsonl")
        trained = {e["group_id"] for e in events if e["event"] == "trained"}
        dropped = {e["group_id"]: e["reason"] for e in events if e["event"] == "dropped"}
        letters = [
            read_dead_letter(m)
            for m in await collect(plane, plane.names.dead_letters)
            if m.headers.get(HEADER_DEAD_REASON, "").startswith("untrusted_worker")
        ]

    # Only the honest worker's groups were trained.
    assert trained and all(workers_of[g] == {HONEST} for g in trained)
    tampered_groups = {g for g, w in workers_of.items() if TAMPERED in w}
    assert tampered_groups, "the tampered worker generated nothing: the test proves nothing"
    # Every tampered group the trainer judged was dropped and dead-lettered, naming the worker.
    judged = tampered_groups & (set(dropped) | trained)
    assert judged and all(dropped[g].startswith(f"untrusted_worker:{TAMPERED}") for g in judged)
    assert {letter.reason for letter in letters} == {f"untrusted_worker:{TAMPERED}"}
    assert all(letter.stage == "trainer" and TAMPERED in letter.message for letter in letters)
    lettered = {
        group_id_of(letter.original_message_id or "", (ScoredRollout.SCHEMA_NAME,))
        for letter in letters
    }
    assert lettered == judged
    # No honest group was judged untrusted.
    assert not any(r.startswith("untrusted_worker") for g, r in dropped.items() if g not in judged)
    # The operator is told: a warning naming the worker, the gauge, the per-worker metrics.
    flagged = [e for e in logs if e["event"] == "trainer.worker_flagged"]
    assert [e["worker"] for e in flagged] == [TAMPERED]
    sample = REGISTRY.get_sample_value
    assert sample("dockyard_worker_flagged", {"worker": TAMPERED}) == 1.0
    assert sample("dockyard_worker_flagged", {"worker": HONEST}) == 0.0
    (metrics_file,) = tmp_path.rglob("metrics.jsonl")
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    last = [r["metrics"] for r in records if "workers/flagged" in r["metrics"]][-1]
    assert last[f"workers/{TAMPERED}/flagged"] == 1.0 and last[f"workers/{HONEST}/flagged"] == 0.0
