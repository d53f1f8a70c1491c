"""A served toolbox under a real run (issue #23): `dockyard run` of the multi-turn demo whose
arithmetic toolbox is a `dockyard tools serve` process, SIGKILLed while the run generates.
Episodes fail against the lost service (every episode opens its session there, so a group
dispatched while it is gone fails whatever the model writes), their groups are nak'ed and
replayed from scratch against a new service, and the trainer's ledger shows every group trained
exactly once. (A service dying inside a call is tests/integration/environments/
test_tool_service.py's.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from dockyard.observability.status_files import read_statuses
from tests.integration.e2e.conftest import (
    ROOT,
    SMALL_RUN,
    start_dockyard,
    stop,
    trainer_step,
    wait_until,
)
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps

pytestmark = pytest.mark.slow

CONFIG = ROOT / "configs" / "multiturn_tools.yaml"
STEPS = 4
PROMPTS_PER_STEP = 4  # SMALL_RUN's grpo.num_prompts_per_step


def serve_tools(server_url: str) -> subprocess.Popen[str]:
    """`dockyard tools serve` of the arithmetic toolbox, returned once it is reachable (the
    line it prints after its endpoints are subscribed on the server)."""
    process = start_dockyard(
        "tools",
        "serve",
        "--config",
        str(CONFIG),
        "--toolbox",
        "arithmetic",
        f"data_plane.url={server_url}",
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("serving toolbox arithmetic"), (line, process.stderr.read())
    return process


def groups_that_lost_their_tools(run_dir: Path) -> set[str]:
    """The groups whose episodes the rollout worker could not run for want of the service."""
    groups = set()
    for line in (run_dir / "logs" / "rollout-0.log").read_text().splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("event") in ("episodes.tool_service_unavailable", "episodes.failed"):
            groups.add(record["group_id"])
    return groups


def failed_episodes(status_dir: Path) -> int:
    return sum(
        int(status.counters.get("failed_episodes", 0))
        for status in read_statuses(status_dir)
        if status.role == "rollout"
    )


def test_killing_the_tool_service_mid_run_trains_every_group_exactly_once(
    tmp_path, nats_server_factory
):
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    status_dir = run_dir / "status"
    tools = serve_tools(server.url)
    run = start_dockyard(
        "run",
        "--config",
        str(CONFIG),
        *SMALL_RUN,
        f"grpo.max_num_steps={STEPS}",
        "grpo.val_period=0",
        "grpo.structured_tool_use.tool_services=[arithmetic]",
        # Naks back off 1, 2, 4, ... s: eight deliveries give the replacement two minutes to
        # come up before a group is dead-lettered (the default five give it 15 s).
        "data_plane.consumer.max_deliver=8",
        f"data_plane.url={server.url}",
        "--run-dir",
        str(run_dir),
    )
    replacement = None
    try:
        wait_until(lambda: trainer_step(status_dir) >= 1, 300, "step 1")
        os.kill(tools.pid, signal.SIGKILL)
        tools.communicate()
        # The worker keeps generating: its next episodes find no service and fail.
        wait_until(lambda: failed_episodes(status_dir) >= 1, 300, "a failed episode")
        replacement = serve_tools(server.url)
        _, stderr = run.communicate(timeout=400)
        assert run.returncode == 0, stderr[-4000:]
    finally:
        for process in (run, tools, replacement):
            if process is not None and process.poll() is None:
                stop(process)
    assert metric_steps(run_dir)[-1] == STEPS
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * PROMPTS_PER_STEP
    # The groups that met the dead service were replayed against the new one and trained.
    retried = groups_that_lost_their_tools(run_dir)
    assert retried and retried <= set(trained), (retried, sorted(trained))
