"""The supervisor of ``dockyard run``: what it leaves for the roles it starts."""

from __future__ import annotations

from dockyard.fleet.supervisor import Supervisor
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
