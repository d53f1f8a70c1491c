"""The supervisor of ``dockyard run``: what it leaves for the roles it starts."""

from __future__ import annotations

import re
import signal
import sys

import pytest

from dockyard.fleet.supervisor import EXIT_REFUSED, RoleProcessFailed, Supervisor
from dockyard.observability.status_files import STARTING, StatusFile, read_statuses


def test_a_new_run_starts_without_the_previous_runs_heartbeats(tmp_path):
    run_dir = tmp_path / "run"
    # The previous run in this directory ended while its fourth worker was still starting.
    StatusFile(run_dir / "status", "rollout", "3").update(STARTING)
    # Roles that exit at once (no such config): only what start() does before them matters.
    supervisor = Supervisor(
        tmp_path / "missing.yaml", [], run_dir, num_rollout_workers=1, num_scorers=1
    )
    try:
        supervisor.start()
    finally:
        supervisor.stop()
    names = {f"{s.role}-{s.instance}" for s in read_statuses(run_dir / "status")}
    assert "rollout-3" not in names


def _supervisor_of(tmp_path, trainer: str, helper: str) -> Supervisor:
    """A supervisor whose trainer and scorer run the given Python code instead of dockyard."""
    supervisor = Supervisor(
        tmp_path / "config.yaml", [], tmp_path / "run", num_rollout_workers=0, num_scorers=1
    )
    supervisor.trainer.argv = [sys.executable, "-c", trainer]
    supervisor.scorers[0].argv = [sys.executable, "-c", helper]
    return supervisor


REFUSE = (
    "import sys; print('dockyard: error: data.train.path: /x.jsonl does not exist', "
    "file=sys.stderr); sys.exit(2)"
)
WAIT = "import time; time.sleep(600)"


def _until_decided(supervisor: Supervisor) -> int:
    """check() until the run is decided (the trainer's code) or a role failed (raises)."""
    while True:
        code = supervisor.check()
        if code is not None:
            return code
        for role in supervisor.roles:  # block on the processes' exits, a moment each
            role.wait(0.05)


def test_a_helper_that_refuses_its_inputs_is_not_restarted_and_its_message_is_shown(tmp_path):
    supervisor = _supervisor_of(tmp_path, WAIT, REFUSE)
    try:
        supervisor.start()
        with pytest.raises(
            RoleProcessFailed,
            match=re.escape("scorer-0 refused to start: data.train.path: /x.jsonl does not exist"),
        ):
            _until_decided(supervisor)
        assert supervisor.scorers[0].restarts == 0
    finally:
        supervisor.stop()


def test_a_trainer_that_refuses_its_inputs_ends_the_run_with_its_message(tmp_path):
    supervisor = _supervisor_of(tmp_path, REFUSE, WAIT)
    try:
        supervisor.start()
        assert _until_decided(supervisor) == EXIT_REFUSED
        assert supervisor.trainer.restarts == 0
        assert supervisor.trainer.error_message() == "data.train.path: /x.jsonl does not exist"
    finally:
        supervisor.stop()


def test_a_crashing_helper_is_restarted(tmp_path):
    supervisor = _supervisor_of(tmp_path, WAIT, "import sys; sys.exit(1)")
    try:
        supervisor.start()
        with pytest.raises(RoleProcessFailed, match="scorer-0 died 4 times"):
            _until_decided(supervisor)
        assert supervisor.scorers[0].restarts == supervisor.max_restarts
    finally:
        supervisor.stop()


def test_the_helpers_drain_once_the_trainer_has_finished_and_are_not_restarted(tmp_path):
    status_dir = tmp_path / "run" / "status"
    finished_then_exit_slowly = (
        "from dockyard.observability.status_files import FINISHED, StatusFile; "
        f"StatusFile({str(status_dir)!r}, 'trainer', '0').update(FINISHED); "
        "import time; time.sleep(600)"
    )
    supervisor = _supervisor_of(tmp_path, finished_then_exit_slowly, WAIT)
    try:
        supervisor.start()
        scorer = supervisor.scorers[0]
        while scorer.poll() is None:  # until the trainer's status file says finished
            assert supervisor.check() is None
            scorer.wait(0.05)
        assert supervisor.draining
        assert scorer.poll() == -signal.SIGTERM  # asked to drain, not killed
        assert supervisor.check() is None  # the trainer is still exiting
        assert scorer.restarts == 0 and scorer.poll() is not None
    finally:
        supervisor.stop()
