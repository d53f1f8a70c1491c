"""``dockyard status`` on a real fleet (issue #26): every role process of ``dockyard run`` over
the embedded JetStream beats on the data plane, and the view read from the broker alone names
them all, with the trainer's weight version and the workers' deliveries."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

import pytest

from tests.integration.e2e.conftest import QUICKSTART, ROOT, run_dockyard, trainer_step, wait_until

NAMESPACE = "statuscheck"


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
    command = [sys.executable, "-m", "dockyard", "--log-format", "json", "run"]
    process = subprocess.Popen(
        [*command, "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    target = ["status", "--url", f"nats://127.0.0.1:{port}", "--namespace", NAMESPACE, "--json"]
    try:
        wait_until(lambda: trainer_step(run_dir / "status") >= 2, 300, "step 2")

        def view() -> dict:
            done = run_dockyard(*target, timeout=120)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        def every_role_busy() -> bool:
            roles = {(r["role"], r["instance"]): r for r in view()["roles"]}
            return (
                set(roles)
                == {
                    ("trainer", "0"),
                    ("rollout", "w0"),
                    ("scorer", "s0"),
                    ("scorer", "s1"),
                }
                and roles[("rollout", "w0")]["received"] > 0
            )

        # Beats come every few seconds: the first ones after step 2 may still say "starting".
        wait_until(every_role_busy, 120, "every role's heartbeat with deliveries")
        seen = view()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()

    roles = {(r["role"], r["instance"]): r for r in seen["roles"]}
    trainer = roles[("trainer", "0")]
    assert trainer["state"] == "running" and not trainer["silent"]
    assert trainer["weight_version"] >= 1  # it stepped at least twice
    # Each role counts its own traffic: a worker publishes rollouts, a scorer scored ones.
    assert roles[("rollout", "w0")]["published"] >= 1
    assert sum(roles[("scorer", f"s{i}")]["published"] for i in range(2)) >= 1
    names = {s["name"] for s in seen["streams"]}
    assert {f"{NAMESPACE}_prompts", f"{NAMESPACE}_experience", f"{NAMESPACE}_heartbeats"} <= names
