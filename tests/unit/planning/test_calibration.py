"""Calibration reads a run directory's own files: costs recovered from timings written with
known values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dockyard.planning.calibration import CalibrationError, calibrate, measured_run
from dockyard.planning.fleet import PipelineRules

G = 4  # samples per group
PER_BATCH, PER_GROUP = 0.05, 0.2  # generation seconds: a batch of n groups takes 0.05 + 0.2 n
TRAIN, PUBLISH, WAIT, OVERHEAD = 0.3, 0.1, 0.5, 0.02
RULES = PipelineRules(4, True, 1, 16, 5, False, 1)


def write_run(run_dir: Path, steps: int = 5) -> None:
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump({"grpo": {"num_generations_per_prompt": G}})
    )
    period = WAIT + TRAIN + PUBLISH + OVERHEAD
    metrics, timeline = [], []
    for step in range(1, steps + 1):
        ages = {"staleness/samples_at_age_0": 4.0 * G} if step == 1 else {
            "staleness/samples_at_age_1": 4.0 * G
        }  # fmt: skip
        metrics.append({"step": step, "time": 1000.0 + step * period, "metrics": {
            "timing/train_step_s": TRAIN, "timing/publish_weights_s": PUBLISH,
            "timing/wait_for_data_s": WAIT, "weights/blob_bytes": 2_000_000.0, **ages,
        }})  # fmt: skip
        # Two batches a step, of 1 and 3 groups: distinct sizes tell the two terms apart.
        started, ended = [], []
        for n, start in ((1, 900.0 + step * 10), (3, 905.0 + step * 10)):
            started += [start] * n * G
            ended += [start + PER_BATCH + n * PER_GROUP] * n * G
        timeline.append({"step": step, "time": 0, "workers": {"w0": {
            "started_at_unix_s": started, "finished_at_unix_s": ended}}})  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "generation_timeline.jsonl").write_text(
        "".join(json.dumps(t) + "\n" for t in timeline)
    )
    refits = [{"event": "refit.done", "version": v, "seconds": 0.07} for v in range(3)]
    (run_dir / "logs" / "rollout-0.log").write_text("".join(json.dumps(r) + "\n" for r in refits))
    stats = {"event": "scorer.env_stats", "groups": 20, "mean_latency_s": 0.011}
    (run_dir / "logs" / "scorer-0.log").write_text(json.dumps(stats) + "\n")


def test_costs_are_the_runs_own_timings(tmp_path):
    write_run(tmp_path)
    costs = calibrate(tmp_path, rules=RULES, workers=1, scorers=1, rollout_bytes=123)
    assert costs.gen_batch_s == pytest.approx(PER_BATCH)
    assert costs.gen_group_s == pytest.approx(PER_GROUP)
    assert costs.train_step_s == TRAIN and costs.publish_s == PUBLISH
    assert costs.step_overhead_s == pytest.approx(OVERHEAD)
    assert costs.refit_s == 0.07 and costs.score_s == 0.011
    assert costs.weight_bytes == 2_000_000 and costs.rollout_bytes == 123
    assert costs.hop_s >= 0


def test_the_measured_run_in_the_simulators_terms(tmp_path):
    write_run(tmp_path)
    run = measured_run(tmp_path)
    period = WAIT + TRAIN + PUBLISH + OVERHEAD
    assert run.steps_per_s == pytest.approx(1 / period)
    assert run.trainer_idle_fraction == pytest.approx(WAIT / period)
    assert run.staleness == {0: 4, 1: 16}


def test_a_directory_that_is_no_run_is_refused(tmp_path):
    with pytest.raises(CalibrationError, match="is this a run directory"):
        calibrate(tmp_path, rules=RULES, workers=1, scorers=1, rollout_bytes=0)
