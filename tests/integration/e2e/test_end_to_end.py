"""The whole pipeline over a real nats-server: trainer, rollout worker and scorer processes."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from dockyard.consumers.trainer.ledger import read_trail
from tests.gpu_stand_in import install_nvidia_smi
from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_few_steps_produce_a_complete_run_directory(tmp_path, small_run, mode, monkeypatch):
    run_dir = tmp_path / "run"
    # The trainer monitors "GPUs": a stand-in nvidia-smi (this machine has none) on its PATH.
    install_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    overrides = [
        *small_run,
        "grpo.max_num_steps=4",
        "logger.num_val_samples_to_print=2",
        "logger.monitor_gpus=true",
        "logger.gpu_monitoring.collection_interval=0.05",
        "logger.gpu_monitoring.flush_interval=0.05",
    ]
    if mode == "sync":
        overrides += [
            "grpo.async_grpo.enabled=false",
            "loss_fn.use_importance_sampling_correction=false",
            "~loss_fn.truncated_importance_sampling_type",
            "~loss_fn.truncated_importance_sampling_ratio",
            "~loss_fn.truncated_importance_sampling_ratio_min",
            # The sync loop's DAPO filter: zero-variance groups are dropped and replaced.
            "grpo.use_dynamic_sampling=true",
            "grpo.dynamic_sampling_max_gen_batches=1",
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
    gpu_series = [m["gpu/1/utilization_pct"] for m in step_metrics if "gpu/1/utilization_pct" in m]
    assert gpu_series and all(value >= 15.0 for series in gpu_series for value in series)
    assert not any("gpu/1/power_w" in m for m in step_metrics)  # the stand-in reports none
    # Every validation (at the start, every 2 steps, at the end) prints its first two answers.
    events = json_events(run_dir / "logs" / "trainer.log")
    validations = [e["step"] for e in events if e["event"] == "trainer.validation"]
    printed = [e for e in events if e["event"] == "validation.sample"]
    assert len(validations) >= 3
    assert [(e["step"], e["index"]) for e in printed] == [
        (step, index) for step in validations for index in (0, 1)
    ]
    assert all(e["prompt"].endswith("=") and "reward" in e for e in printed)
    # The terminal's end-of-run summary says how validation accuracy moved, first to last
    # validation, as the trainer's log does (issue #42, item 6).
    accuracies = [e["accuracy"] for e in events if e["event"] == "trainer.validation"]
    moved = re.search(r"^validation accuracy ([0-9.]+) → ([0-9.]+)$", result.stderr, re.M)
    assert moved, result.stderr[-2000:]
    assert [float(x) for x in moved.groups()] == pytest.approx(
        [accuracies[0], accuracies[-1]], abs=5e-4
    )
    # The generation timeline: a per-worker summary in the metrics (one rollout worker, one entry
    # per sample), the raw intervals one line per step in their own file.
    assert all(m["timing/generation_timeline/w0/count"] == 4 * 4 for m in step_metrics)
    assert not any(isinstance(value, dict) for m in step_metrics for value in m.values())
    timelines = [
        json.loads(line)
        for line in (run_dir / "generation_timeline.jsonl").read_text().splitlines()
    ]
    assert [t["step"] for t in timelines] == metric_steps(run_dir)
    assert all(len(t["workers"]["w0"]["started_at_unix_s"]) == 4 * 4 for t in timelines)
    if mode == "sync":
        assert all(m["staleness/max"] == 0 for m in step_metrics)
        dropped = [e for e in read_trail(run_dir / "ledger.jsonl") if e["event"] == "dropped"]
        assert all("dynamic sampling" in e["reason"] for e in dropped)
        assert len(dropped) <= 4 * 4  # at most one generation batch's worth per step
    trained = assert_exactly_once(run_dir)
    assert len(trained) == 4 * 4
    assert_every_group_accounted(run_dir)
    assert (run_dir / "progress.png").stat().st_size > 1000
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_4"]
    for step in (2, 4):  # validated at the step: retention ranks them by it (the last one too)
        metadata = json.loads(
            (run_dir / "checkpoints" / f"step_{step}" / "checkpoint.json").read_text()
        )
        assert "val:accuracy" in metadata["metrics"], metadata
    if mode == "async":
        assert_checkpoint_exports_to_hf(run_dir / "checkpoints" / "step_4", tmp_path / "hf")


def json_events(log_file) -> list[dict]:
    lines = log_file.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def assert_checkpoint_exports_to_hf(checkpoint, out):
    """The trainer's checkpoint converts to a Hugging Face directory with the same logits."""
    import torch
    from transformers import AutoModelForCausalLM

    from dockyard.checkpoints.model_files import load_checkpoint_state_dict
    from dockyard.consumers.trainer.trainer_checkpoint import load_weights
    from dockyard.models import build_arithmetic_policy

    result = run_dockyard("export", "hf", "--checkpoint", str(checkpoint), "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    trained, tokenizer = build_arithmetic_policy(seed=99)
    load_weights(trained.eval(), load_checkpoint_state_dict(checkpoint), checkpoint)
    ids = torch.tensor([tokenizer("12+34=")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, trained(ids).logits)


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
