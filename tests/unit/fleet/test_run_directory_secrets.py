"""A run directory holds the resolved config (``data_plane.credentials`` included) and logs: only
its owner may read them, and no secret is ever on a process's command line, which every local
user can read (``ps``, ``/proc/PID/cmdline``)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from dockyard.fleet.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
SECRET = "hunter2-not-for-argv"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _dockyard(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "dockyard", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def test_dockyard_run_writes_its_config_for_the_owner_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # The run fails at once (no such model), after it wrote its run directory.
    result = _dockyard(
        "run", "--config", str(QUICKSTART), "--run-dir", str(run_dir),
        "data_plane=null", "policy.model_name=/no-such-model",
    )  # fmt: skip
    assert result.returncode != 0
    assert _mode(run_dir) == 0o700
    assert _mode(run_dir / "config.yaml") == 0o600


def test_role_processes_get_no_secret_and_private_logs(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"data_plane:\n  credentials:\n    user: alice\n    password: {SECRET}\n")
    run_dir = tmp_path / "run"
    # Roles that exit at once (the file is no full config): what start() hands them matters.
    supervisor = Supervisor(config, [], run_dir, num_rollout_workers=1, num_scorers=1)
    try:
        supervisor.start()
    finally:
        supervisor.stop()
    for role in supervisor.roles:
        assert not any(SECRET in arg for arg in role.argv), role.argv
        assert _mode(role.log_path) == 0o600
    assert _mode(run_dir / "logs") == 0o700


def test_secrets_are_refused_as_command_line_overrides() -> None:
    for override in (
        f"+data_plane.credentials.password={SECRET}",
        f"data_plane.credentials.token={SECRET}",
        f"data_plane.url=nats://alice:{SECRET}@10.0.0.1:4222",
    ):
        result = _dockyard("config", "show", "--config", str(QUICKSTART), override)
        assert result.returncode == 2, (override, result.stdout[-300:])
        assert "refused on the command line" in result.stderr
        assert SECRET not in result.stdout
