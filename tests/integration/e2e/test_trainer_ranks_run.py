"""``dockyard run --trainer-ranks 2`` over a real nats-server: two trainer processes under
torchrun (gloo), rank 0 talking to the data plane, train every group exactly once; the run then
resumes its sharded checkpoint with one trainer process and goes on exactly-once."""

from __future__ import annotations

import json

import pytest

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
)
from tests.integration.e2e.test_end_to_end import json_events

pytestmark = pytest.mark.slow


def trainer_events(run_dir) -> list[dict]:
    return json_events(run_dir / "logs" / "trainer.log")


def run_two_ranks(run_dir, small_run, *overrides: str):
    """``dockyard run --trainer-ranks 2`` on the quickstart, small."""
    return run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        *overrides,
        "--trainer-ranks",
        "2",
        "--run-dir",
        str(run_dir),
    )


def step_metrics(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["metrics"] for r in records if "train/reward_mean" in r["metrics"]]


def test_two_trainer_ranks_train_every_group_once_and_resume_in_one_process(tmp_path, small_run):
    run_dir = tmp_path / "run"
    first = run_two_ranks(run_dir, small_run, "grpo.max_num_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    events = trainer_events(run_dir)
    placements = [e for e in events if e["event"] == "trainer.placement"]
    assert [e["data_parallel_ranks"] for e in placements] == [2, 2]  # both ranks sharded
    assert [e["rank"] for e in events if e["event"] == "trainer.following"] == [1]
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    steps = step_metrics(run_dir)
    assert all(m["timing/scatter_batch_s"] > 0 for m in steps)
    assert all(m["loss/num_valid_samples"] == 4 * 4 for m in steps)  # both ranks' shares
    trained_before = set(assert_exactly_once(run_dir))
    assert len(trained_before) == 4 * 4
    assert_every_group_accounted(run_dir)

    second = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        "grpo.max_num_steps=6",
        "--run-dir",
        str(run_dir),
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert metric_steps(run_dir)[-2:] == [5, 6]
    resumed = [e for e in trainer_events(run_dir) if e["event"] == "trainer.resumed"]
    assert [e["step"] for e in resumed] == [4]
    trained_after = assert_exactly_once(run_dir)
    assert trained_before < set(trained_after)
    assert len(trained_after) == 6 * 4


def test_two_tensor_parallel_ranks_train_every_group_once(tmp_path, small_run):
    run_dir = tmp_path / "run"
    result = run_two_ranks(
        run_dir, small_run, "grpo.max_num_steps=2", "policy.dtensor_cfg.tensor_parallel_size=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    placements = [e for e in trainer_events(run_dir) if e["event"] == "trainer.placement"]
    assert [(e["tensor_parallel_ranks"], e["data_parallel_ranks"]) for e in placements] == [
        (2, 1),
        (2, 1),
    ]
    assert metric_steps(run_dir) == [1, 2]
    assert len(assert_exactly_once(run_dir)) == 2 * 4
    assert (run_dir / "checkpoints" / "step_2" / "optimizer.pt").is_file()


def test_two_trainer_ranks_screen_workers_and_train_an_honest_fleet(tmp_path, small_run):
    # grpo.worker_trust with two ranks: each step's screen is a collective of both ranks (rank 0
    # alone would leave rank 1's FSDP2 all-gathers unmatched and hang). The fleet's workers load
    # the trainer's own weights, so by the screen's definition they agree and none is flagged.
    run_dir = tmp_path / "run"
    result = run_two_ranks(
        run_dir,
        small_run,
        "grpo.max_num_steps=2",
        "grpo.worker_trust.enabled=true",
        "grpo.worker_trust.min_tokens=1",  # judged from each worker's first group on
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_steps(run_dir) == [1, 2]
    steps = step_metrics(run_dir)
    measured = [key for key in steps[-1] if key.endswith("/token_mult_prob_error")]
    assert measured, "no worker was measured"
    assert all(m["workers/flagged"] == 0 for m in steps)
    assert len(assert_exactly_once(run_dir)) == 2 * 4


def test_two_context_parallel_ranks_train_every_group_once(tmp_path, small_run):
    # policy.dtensor_cfg.context_parallel_size=2: both ranks hold the same share and each runs
    # half of every sequence's positions (the all-gather-KV attention).
    run_dir = tmp_path / "run"
    result = run_two_ranks(
        run_dir, small_run, "grpo.max_num_steps=2", "policy.dtensor_cfg.context_parallel_size=2"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    placements = [e for e in trainer_events(run_dir) if e["event"] == "trainer.placement"]
    assert [(e["context_parallel_ranks"], e["data_parallel_ranks"]) for e in placements] == [
        (2, 1),
        (2, 1),
    ]
    assert metric_steps(run_dir) == [1, 2]
    # One data-parallel group: each step trains the whole batch (4 groups × 4 samples) once.
    assert all(m["loss/num_valid_samples"] == 4 * 4 for m in step_metrics(run_dir))
    assert len(assert_exactly_once(run_dir)) == 2 * 4
    assert (run_dir / "checkpoints" / "step_2" / "optimizer.pt").is_file()


def test_two_expert_parallel_ranks_train_a_mixture_of_experts_every_group_once(tmp_path, small_run):
    # policy.dtensor_cfg.expert_parallel_size=2 on the tiny Qwen3-MoE (4 experts per layer): each
    # rank holds two experts of every layer and trains its own share of the batch (the ep ranks
    # are data-parallel ranks); the rollout worker generates with the whole model.
    run_dir = tmp_path / "run"
    result = run_two_ranks(
        run_dir,
        small_run,
        "grpo.max_num_steps=2",
        "policy.model_name=tiny://qwen3-moe-arithmetic",
        "policy.dtensor_cfg.expert_parallel_size=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    placements = [e for e in trainer_events(run_dir) if e["event"] == "trainer.placement"]
    assert [(e["expert_parallel_ranks"], e["data_parallel_ranks"]) for e in placements] == [
        (2, 2),
        (2, 2),
    ]
    assert metric_steps(run_dir) == [1, 2]
    # Two shares, one per rank: each step trains the whole batch (4 groups × 4 samples) once.
    assert all(m["loss/num_valid_samples"] == 4 * 4 for m in step_metrics(run_dir))
    assert len(assert_exactly_once(run_dir)) == 2 * 4
    assert_every_group_accounted(run_dir)
    assert (run_dir / "checkpoints" / "step_2" / "optimizer.pt").is_file()
