"""The quickstart pipeline with the JAX trainer backend (``policy.jax_cfg.enabled=true``) over a
real nats-server: trainer, rollout worker and scorer processes, weights published by the JAX
trainer and refitted by the torch engine (digest-verified), checkpoints, and a resume that
restores the JAX optimizer state and the checkpoint's weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
)

pytestmark = pytest.mark.slow

JAX_ON = ["policy.dtensor_cfg.enabled=false", "policy.jax_cfg.enabled=true"]


def events(log_file) -> list[dict]:
    return [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]


def test_the_quickstart_trains_publishes_and_resumes_under_jax(tmp_path, small_run):
    run_dir = tmp_path / "run"
    first = run_dockyard(
        "run", "--config", str(QUICKSTART), *small_run, *JAX_ON, "grpo.max_num_steps=4",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    trainer_events = events(run_dir / "logs" / "trainer.log")
    placement = [e for e in trainer_events if e["event"] == "trainer.placement"]
    assert placement and all(e.get("backend") == "jax" for e in placement)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["metrics"] for r in records if "loss/loss" in r["metrics"]]
    # (an untrained policy may earn no reward in 4 steps: zero advantages, zero gradient)
    assert steps and all(math.isfinite(m["loss/loss"] + m["train/grad_norm"]) for m in steps)

    # The rollout worker refitted every version the JAX trainer published, each blob checked
    # against its digest on the way in (a mismatch would be refit.refused).
    rollout = events(run_dir / "logs" / "rollout-0.log")
    assert not [e for e in rollout if e["event"] == "refit.refused"]
    assert max(e["version"] for e in rollout if e["event"] == "refit.done") >= 4

    checkpoint = run_dir / "checkpoints" / "step_4"
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=False)
    # The torch trainer's layout (either backend resumes it): Adam state by parameter name,
    # the schedule 4 steps in.
    assert optimizer["scheduler"]["last_epoch"] == 4
    moments = optimizer["optimizer"]["state"]["model.embed_tokens.weight"]
    assert float(moments["step"]) == 4

    trained_before = set(assert_exactly_once(run_dir))
    second = run_dockyard(
        "run", "--config", str(QUICKSTART), *small_run, *JAX_ON, "grpo.max_num_steps=6",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert metric_steps(run_dir)[-2:] == [5, 6]
    resumed = events(run_dir / "logs" / "trainer.log")
    # The checkpoint's weights went into the torch mirror; the JAX trainer took them back.
    assert [e for e in resumed if e["event"] == "trainer.jax_weights_reloaded"]
    trained_after = assert_exactly_once(run_dir)
    assert trained_before < set(trained_after)
    assert_every_group_accounted(run_dir)
