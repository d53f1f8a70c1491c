"""``dockyard simulate --calibration`` on a real run directory: the files a run writes are the
ones calibration reads, and the calibrated simulation of that run reproduces it."""

from __future__ import annotations

import json

import pytest

from dockyard.planning.calibration import measured_run
from tests.integration.e2e.conftest import QUICKSTART, run_dockyard

pytestmark = pytest.mark.slow


def test_a_calibrated_simulation_of_the_measured_run_matches_it(tmp_path, small_run):
    run_dir = tmp_path / "run"
    overrides = [*small_run, "grpo.max_num_steps=6", "grpo.val_period=1000"]
    result = run_dockyard("run", "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]

    simulated = run_dockyard(
        "simulate", "--config", str(run_dir / "config.yaml"), "--calibration", str(run_dir),
        "--json",
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    report = json.loads(simulated.stdout)
    measured = measured_run(run_dir)
    prediction = report["prediction"]
    # The run's own rules: 4 groups a step, async with a staleness bound of 1 (quickstart).
    assert report["rules"]["num_prompts_per_step"] == 4
    assert report["rules"]["in_flight_capacity"] == 8
    # Every cost was found in the run's files (a missing file or event would leave 0).
    costs = report["costs"]
    for name in ("gen_group_s", "train_step_s", "publish_s", "score_s", "refit_s"):
        assert costs[name] > 0, name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    blob_bytes = [
        r["metrics"]["weights/blob_bytes"] for r in records if "weights/blob_bytes" in r["metrics"]
    ]
    assert blob_bytes and costs["weight_bytes"] == max(blob_bytes)
    # The one fitted cost (hop_s) is chosen so the simulated run makes the measured steps/s;
    # a fit that could not reach it (a run faster than the simulation with no broker time)
    # leaves hop_s at 0. The simulated rate is a step function of hop_s (discrete events: a
    # hop more or less per step), so the fit lands within a few percent, not exactly.
    if costs["hop_s"] > 0:
        assert prediction["steps_per_s"] == pytest.approx(measured.steps_per_s, rel=0.05)
    assert prediction["staleness_max"] <= 1
