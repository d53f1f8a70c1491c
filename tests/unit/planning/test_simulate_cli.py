"""``dockyard simulate``: its output for a config, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dockyard.cli import main

QUICKSTART = str(Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml")
SMALL = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
]
# Generation dominates: one worker fetching one group at a time makes 1 / 2 s groups per second.
COSTS = ["--gen-group-s", "2", "--gen-batch-s", "0", "--train-step-s", "0.001",
         "--publish-s", "0", "--step-overhead-s", "0", "--hop-s", "0", "--score-s", "0",
         "--refit-s", "0", "--weight-bytes", "1000000"]  # fmt: skip


def simulate(*args: str) -> int:
    return main(["--log-format", "json", "simulate", "--config", QUICKSTART, *args])


def test_json_prediction_of_a_generation_bound_worker(capsys):
    status = simulate(
        *SMALL, "data_plane.consumer.fetch_batch=1", *COSTS, "--workers", "1", "--steps", "10",
        "--json",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    report = json.loads(out)
    prediction = report["prediction"]
    assert prediction["groups_per_s"] == pytest.approx(0.5, rel=1e-6)
    assert prediction["steps"] == 10
    # quickstart: async, max_trajectory_age_steps 1.
    assert prediction["staleness_max"] <= 1
    assert report["rules"]["max_age"] == 1
    # The dispatcher's budget: (max_trajectory_age_steps + 1) × num_prompts_per_step.
    assert report["rules"]["in_flight_capacity"] == (1 + 1) * 4
    assert report["fleet"]["workers"] == 1


def test_text_prediction_names_each_quantity(capsys):
    status = simulate(*SMALL, *COSTS, "--workers", "2", "--sites", "2", "--wan-mbit", "100",
                      "--latency-ms", "30", "--steps", "5")  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0
    assert "2 rollout workers over 2 site(s)" in out
    assert "WAN 100.0 Mbit/s, latency 30.0 ms" in out
    for line in ("throughput:", "trainer idle fraction:", "staleness (trained groups by age):"):
        assert line in out
    # Two sites × five versions, each a full snapshot of 1,000,000 bytes.
    assert "weight bytes on the WAN: 10,000,000" in out


def test_an_unknown_option_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulate(*COSTS, "--gpus", "8")
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --gpus" in capsys.readouterr().err


def test_without_a_calibration_every_stage_cost_is_needed(capsys):
    assert simulate("--gen-group-s", "1") == 2
    err = capsys.readouterr().err
    assert "no --calibration run directory" in err
    assert "--train-step-s" in err and "--gen-group-s" not in err.split("missing")[1]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--workers", "0"], "workers must be ≥ 1"),
        (["--workers", "1", "--sites", "2"], "2 sites need at least one worker each"),
        (["--wan-mbit", "-5"], "wan_mbit must be > 0"),
        (["--steps", "0"], "steps must be ≥ 1"),
        (["--shared-cores", "0"], "shared_cores must be ≥ 1"),
        (["data_plane.weight_transport.patches.enabled=true"], "give the patch ratio"),
    ],
)
def test_impossible_settings_are_refused_with_the_reason(capsys, args, says):
    assert simulate(*SMALL, *args, *COSTS) == 2
    err = capsys.readouterr().err
    assert "impossible fleet" in err and says in err


def test_a_calibration_directory_that_is_no_run_is_refused(capsys, tmp_path):
    assert simulate(*SMALL, "--calibration", str(tmp_path)) == 2
    assert "is this a run directory?" in capsys.readouterr().err


def test_a_bad_config_key_is_refused_with_its_path(capsys):
    assert simulate(*COSTS, "grpo.num_prompts_per_stepp=3") == 2
    assert "num_prompts_per_step" in capsys.readouterr().err
