"""Faults during a run: SIGKILL a rollout worker, a scorer, the trainer, and the broker (then
restart it on the same store). The run completes each time and the trainer's ledger shows every
dispatched group trained exactly once or explicitly dropped."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.observability.status_files import read_statuses
from tests.integration.e2e.conftest import QUICKSTART, ROOT, trainer_step, wait_until
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
)

pytestmark = pytest.mark.slow

STEPS = 10


def pid_of(status_dir: Path, role: str) -> int:
    for status in read_statuses(status_dir):
        if status.role == role and status.state == "running":
            return status.pid
    raise AssertionError(f"no running {role}")


def start_run(run_dir: Path, server_url: str, overrides: list[str]) -> subprocess.Popen[str]:
    """The real ``dockyard run`` of the quickstart against an external nats-server."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dockyard",
            "--log-format",
            "json",
            "run",
            "--config",
            str(QUICKSTART),
            *overrides,
            f"data_plane.url={server_url}",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout_s: float) -> str:
    """Wait for the run to end by itself and return its stderr; it must exit cleanly."""
    try:  # within pytest's own timeout, so that a hang still shows the run's last words
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        raise AssertionError(f"the run did not finish:\n{stderr[-6000:]}") from None
    assert process.returncode == 0, stderr[-4000:]
    return stderr


def test_the_run_survives_killed_roles_and_a_broker_restart(
    tmp_path, small_run, nats_server_factory
):
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    status_dir = run_dir / "status"
    process = start_run(run_dir, server.url, [*small_run, f"grpo.max_num_steps={STEPS}"])
    try:
        for role, at_step in (("rollout", 1), ("scorer", 3), ("trainer", 5)):
            wait_until(lambda s=at_step: trainer_step(status_dir) >= s, 180, f"step {at_step}")
            os.kill(pid_of(status_dir, role), signal.SIGKILL)
        wait_until(lambda: trainer_step(status_dir) >= 6, 240, "the restarted trainer")
        server.kill()
        time.sleep(0.5)  # the outage itself, not synchronisation: the roles must ride it out
        server.restart()
        finish(process, 200)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert metric_steps(run_dir)[-1] == STEPS
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * 4


#: Steps of the restart run, the step at which the broker is killed, and how long it stays down.
#: The steps are small (a tenth of a second each): medians of a dozen steps or more on either
#: side of the outage, measured seconds apart, share the machine's load.
SPEED_STEPS = 48
KILL_AT_STEP = 16
OUTAGE_S = 5.0
#: Steps right after a restart that may still be slow (reconnect, redeliveries, a refit), and
#: by when after the restart they must be done: the roles are back within seconds.
SETTLING_STEPS = 3
RECOVERY_S = 8.0


def step_times(run_dir: Path) -> dict[int, float]:
    """When each training step ended (its metrics record)."""
    stamps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "train/reward_mean" in record["metrics"]:
            stamps[record["step"]] = record["time"]
    return stamps


def test_after_a_broker_restart_every_role_is_back_to_its_speed(
    tmp_path, small_run, nats_server_factory
):
    # Issue #17: after a SIGKILL and restart of the broker nothing was lost, but the run never
    # recovered: ten times slower per step to the end (failed refits, stale groups dropped).
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    status_dir = run_dir / "status"
    quiet = [  # no validation or checkpoint in between: step times measure the pipeline
        "grpo.val_period=1000",
        "grpo.val_at_start=false",
        "grpo.val_at_end=false",
        "checkpointing.save_period=1000",
    ]
    process = start_run(
        run_dir, server.url, [*small_run, *quiet, f"grpo.max_num_steps={SPEED_STEPS}"]
    )
    try:
        wait_until(lambda: trainer_step(status_dir) >= KILL_AT_STEP, 180, f"step {KILL_AT_STEP}")
        server.kill()
        time.sleep(OUTAGE_S)  # the outage itself, not synchronisation
        server.restart()
        restarted_at = time.time()
        back_at_step = trainer_step(status_dir)
        finish(process, 150)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert metric_steps(run_dir)[-1] == SPEED_STEPS
    assert len(assert_exactly_once(run_dir)) == SPEED_STEPS * 4
    assert_every_group_accounted(run_dir)
    ended = step_times(run_dir)
    seconds = {step: ended[step] - ended[step - 1] for step in ended if step - 1 in ended}
    settled = back_at_step + SETTLING_STEPS
    assert ended[settled] - restarted_at <= RECOVERY_S, (back_at_step, seconds)
    # The first steps wait for the first weights and warm up.
    before = [seconds[step] for step in range(3, KILL_AT_STEP + 1)]
    after = [seconds[step] for step in seconds if step > settled]
    assert len(after) >= 12, (back_at_step, seconds)
    # The failure was 10x slower to the end; 3x leaves room for what the other suite workers
    # do to this machine between the two windows (the steps are ~0.1 s each).
    assert statistics.median(after) <= 3 * statistics.median(before), (before, after)
