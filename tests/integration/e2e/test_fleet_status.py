"""``dockyard status`` on a real fleet (issue #26): every role process of ``dockyard run`` over
the embedded JetStream beats on the data plane, and the view read from the broker alone names
them all, with the trainer's weight version and each role's deliveries."""

from __future__ import annotations

import json
import socket

import pytest

from tests.integration.e2e.conftest import (
    QUICKSTART,
    run_dockyard,
    start_dockyard,
    stop,
    trainer_step,
    wait_until,
)

NAMESPACE = "statuscheck"
ROLES = {("trainer", "0"), ("rollout", "w0"), ("scorer", "s0"), ("scorer", "s1")}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_status_shows_every_role_of_a_running_fleet(tmp_path, small_run):
    run_dir = tmp_path / "run"
    port = _free_port()
    overrides = [
        *small_run,
        "grpo.max_num_steps=1000",
        "run.num_scorers=2",
        f"data_plane.embedded.port={port}",
        f"data_plane.namespace={NAMESPACE}",
    ]
    process = start_dockyard(
        "run", "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir)
    )
    target = ["status", "--url", f"nats://127.0.0.1:{port}", "--namespace", NAMESPACE, "--json"]

    def view() -> dict:
        done = run_dockyard(*target, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def roles_of(seen: dict) -> dict:
        return {(r["role"], r["instance"]): r for r in seen["roles"]}

    def every_role_busy() -> bool:
        roles = roles_of(view())
        return set(roles) == ROLES and all(r["received"] > 0 for r in roles.values())

    try:
        wait_until(lambda: trainer_step(run_dir / "status") >= 2, 300, "step 2")
        # Beats come every few seconds: the first ones after step 2 may still say "starting".
        wait_until(every_role_busy, 120, "every role's heartbeat with deliveries")
        seen = view()
    finally:
        stop(process)

    roles = roles_of(seen)
    trainer = roles[("trainer", "0")]
    assert trainer["state"] == "running" and not trainer["silent"]
    assert trainer["weight_version"] >= 1  # it stepped at least twice
    # Each role counts its own traffic: a worker publishes rollouts, a scorer scored ones.
    assert roles[("rollout", "w0")]["published"] >= 1
    assert sum(roles[("scorer", f"s{i}")]["published"] for i in range(2)) >= 1
    names = {s["name"] for s in seen["streams"]}
    assert {f"{NAMESPACE}_prompts", f"{NAMESPACE}_experience", f"{NAMESPACE}_heartbeats"} <= names
