"""``dockyard run`` with ``data_plane: null``: every role in one process over one MemoryPlane
(the spec's "None = in-memory"), and the per-role commands refusing that plane."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import yaml

from dockyard.cli import main
from dockyard.consumers.trainer.ledger import read_trail
from dockyard.observability.status_files import read_statuses
from tests.integration.e2e.conftest import QUICKSTART, ROOT, run_dockyard, trainer_step, wait_until
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    assert_staleness_histograms_count_each_trained_sample,
    metric_steps,
)

STEPS = 4


def log_events(run_dir) -> list[dict]:
    lines = (run_dir / "logs" / "run.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.slow
def test_a_few_steps_in_one_process_produce_a_complete_run_directory(tmp_path, small_run):
    run_dir = tmp_path / "run"
    result = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        "data_plane=null",
        f"grpo.max_num_steps={STEPS}",
        "run.num_rollout_workers=2",
        "run.num_scorers=2",
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"trained {STEPS} steps" in result.stdout

    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data_plane"] is None
    assert not (run_dir / "nats").exists()  # no broker: the plane is in memory
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * 4  # grpo.num_prompts_per_step=4 groups a step
    assert_every_group_accounted(run_dir)
    # SMALL_RUN has grpo.num_generations_per_prompt=4 samples a group.
    assert_staleness_histograms_count_each_trained_sample(run_dir, generations_per_group=4)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_4"]
    assert (run_dir / "progress.png").stat().st_size > 1000

    # Every role reported through its status file, and stopped when the trainer finished.
    states = {f"{s.role}-{s.instance}": s for s in read_statuses(run_dir / "status")}
    assert set(states) == {"trainer-0", "rollout-w0", "rollout-w1", "scorer-s0", "scorer-s1"}
    assert states["trainer-0"].state == "finished"
    assert all(states[name].state == "stopped" for name in set(states) - {"trainer-0"})
    # Both workers loaded the trainer's weights from the one plane (version 0 comes first).
    assert all(states[f"rollout-w{i}"].counters.get("weight_version", -1) >= 0 for i in (0, 1))

    # One log for the process, each line naming its role.
    events = log_events(run_dir)
    roles = {e.get("role") for e in events}
    everyone = {"trainer-0", "rollout-0", "rollout-1", "scorer-0", "scorer-1"}
    # (a scorer logs only once it has scored: one of the two may have had nothing to do)
    assert {"trainer-0", "rollout-0", "rollout-1"} <= roles <= everyone
    validations = [e for e in events if e["event"] == "trainer.validation"]
    assert validations and all(e["role"] == "trainer-0" for e in validations)
    assert not [e for e in events if e["level"] == "error"]


@pytest.mark.slow
def test_a_role_that_fails_ends_the_run_naming_it(tmp_path, small_run):
    # Operands of 41 digits: every prompt (85 tokens) is longer than the quickstart policy's
    # context (64 positions), so the real torch engine refuses each group and the worker gives
    # up after three consecutive failures (WorkerUnhealthy). The trainer never gets data: the
    # run must end on the worker's failure, not wait for the trainer's starvation timeout.
    big = 10**40
    run_dir = tmp_path / "run"
    result = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        *small_run,
        "data_plane=null",
        f"grpo.max_num_steps={STEPS}",
        f"data.train.params.low={big}",
        f"data.train.params.high={big + 9}",
        "data.max_input_seq_length=100",  # so the dispatcher sends them
        "policy.max_total_sequence_length=128",
        "--run-dir",
        str(run_dir),
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("dockyard: error: rollout-0 failed: WorkerUnhealthy"), error
    assert "leaves no room in the model's context" in error
    assert str(run_dir / "logs" / "run.log") in error
    failures = [e for e in log_events(run_dir) if e["event"] == "fleet.role_failed"]
    assert [e["role"] for e in failures] == ["rollout-0"]
    assert "Traceback" in failures[0]["exception"]
    # The other roles were stopped, not left running.
    states = {f"{s.role}-{s.instance}": s.state for s in read_statuses(run_dir / "status")}
    assert states["scorer-s0"] == "stopped"
    assert states["trainer-0"] == "finished"
    assert states["rollout-w0"] == "stopped"


@pytest.mark.slow
def test_sigterm_drains_every_role_and_exits_130(tmp_path, small_run):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "dockyard", "--log-format", "json", "run"]
    overrides = [*small_run, "data_plane=null", "grpo.max_num_steps=1000"]
    process = subprocess.Popen(
        [*command, "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: trainer_step(run_dir / "status") >= 2, 180, "step 2")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr[-3000:]
    states = {f"{s.role}-{s.instance}": s.state for s in read_statuses(run_dir / "status")}
    assert states == {"trainer-0": "finished", "rollout-w0": "stopped", "scorer-s0": "stopped"}
    # The stopped trainer still closed its books: a final checkpoint, and a ledger in which
    # every group it dispatched is trained, dropped or open at the end, none trained twice.
    assert_exactly_once(run_dir)
    steps = metric_steps(run_dir)
    assert steps and (run_dir / "checkpoints" / f"step_{steps[-1]}").is_dir()
    events = read_trail(run_dir / "ledger.jsonl")
    open_at_end = [e for e in events if e["event"] == "open_at_end"]
    assert all("stopped" in e["reason"] for e in open_at_end)


@pytest.mark.parametrize("role", ["trainer", "rollout", "score"])
def test_a_single_role_over_the_in_memory_plane_is_refused_at_launch(role, tmp_path, capsys):
    argv = [role, "--config", str(QUICKSTART), "data_plane=null"]
    if role == "trainer":
        argv += ["--run-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "data_plane: null" in err and "use `dockyard run`" in err
    assert not list(tmp_path.iterdir())  # refused before anything was written or started
