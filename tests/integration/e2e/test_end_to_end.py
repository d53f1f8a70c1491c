"""The whole pipeline over a real nats-server: trainer, rollout worker and scorer processes."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_few_steps_produce_a_complete_run_directory(tmp_path, small_run, mode):
    run_dir = tmp_path / "run"
    overrides = [*small_run, "grpo.max_num_steps=4"]
    if mode == "sync":
        overrides += [
            "grpo.async_grpo.enabled=false",
            "loss_fn.use_importance_sampling_correction=false",
            "~loss_fn.truncated_importance_sampling_type",
            "~loss_fn.truncated_importance_sampling_ratio",
            "~loss_fn.truncated_importance_sampling_ratio_min",
        ]
    result = run_dockyard("run", "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]

    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["grpo"]["async_grpo"]["enabled"] is (mode == "async")
    assert metric_steps(run_dir) == [1, 2, 3, 4]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_metrics = [r["metrics"] for r in records if "train/reward_mean" in r["metrics"]]
    for name in (
        "loss/loss",
        "loss/clip_fraction",
        "loss/is_weight_mean",
        "staleness/mean",
        "staleness/max",
        "train/tokens_per_s",
        "timing/wait_for_data_s",
        "timing/train_step_s",
        "timing/publish_weights_s",
    ):
        assert all(name in m for m in step_metrics), name
    assert any("val/accuracy" in r["metrics"] for r in records)
    if mode == "sync":
        assert all(m["staleness/max"] == 0 for m in step_metrics)
    trained = assert_exactly_once(run_dir)
    assert len(trained) == 4 * 4
    assert (run_dir / "progress.png").stat().st_size > 1000
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_4"]
    assert (run_dir / "checkpoints" / "step_4" / "model.safetensors").is_file()


def test_resume_continues_the_step_count_and_trains_no_group_twice(tmp_path, small_run):
    run_dir = tmp_path / "run"
    first = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        "grpo.max_num_steps=4",
        "--run-dir",
        str(run_dir),
    )
    assert first.returncode == 0, first.stderr[-3000:]
    trained_before = set(assert_exactly_once(run_dir))
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
    trained_after = assert_exactly_once(run_dir)
    assert trained_before < set(trained_after)
    assert len(trained_after) == 6 * 4
