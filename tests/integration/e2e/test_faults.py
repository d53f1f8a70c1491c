"""Faults during a run: SIGKILL a rollout worker, a scorer, the trainer, and the broker (then
restart it on the same store). The run completes each time and the trainer's ledger shows every
dispatched group trained exactly once or explicitly dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.utils.status import read_statuses
from tests.integration.e2e.conftest import QUICKSTART, ROOT, trainer_step, wait_until
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps

pytestmark = pytest.mark.slow

STEPS = 10


def pid_of(status_dir: Path, role: str) -> int:
    for status in read_statuses(status_dir):
        if status.role == role and status.state == "running":
            return status.pid
    raise AssertionError(f"no running {role}")


def test_the_run_survives_killed_roles_and_a_broker_restart(
    tmp_path, small_run, nats_server_factory
):
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    status_dir = run_dir / "status"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dockyard",
            "--log-format",
            "json",
            "run",
            "--config",
            str(QUICKSTART),
            *small_run,
            f"grpo.max_num_steps={STEPS}",
            f"data_plane.url={server.url}",
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for role, at_step in (("rollout", 1), ("scorer", 3), ("trainer", 5)):
            wait_until(lambda s=at_step: trainer_step(status_dir) >= s, 180, f"step {at_step}")
            os.kill(pid_of(status_dir, role), signal.SIGKILL)
        wait_until(lambda: trainer_step(status_dir) >= 6, 240, "the restarted trainer")
        server.kill()
        time.sleep(0.5)  # the outage itself, not synchronisation: the roles must ride it out
        server.restart()
        try:  # within pytest's own timeout, so that a hang still shows the run's last words
            _, stderr = process.communicate(timeout=200)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
            raise AssertionError(f"the run did not finish:\n{stderr[-6000:]}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr[-4000:]
    assert metric_steps(run_dir)[-1] == STEPS
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * 4
