"""``dockyard replay retrain`` after a real quickstart run (``dockyard run``: trainer, torch
rollout worker and scorer as processes, an external nats-server) whose trainer was SIGKILLed
mid-way and restarted by the supervisor: the recorded steps re-trained from the stored stream
equal the run's bit for bit, weights digests included (the run's own records are the expected
values: its metrics.jsonl and the weight events it published)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.integration.e2e.conftest import run_dockyard, trainer_step, wait_until
from tests.integration.e2e.test_faults import finish, pid_of, start_run

pytestmark = pytest.mark.slow

STEPS = 7
#: Without the SFT warm start the policy answers no sum right: every reward is 0, every
#: advantage 0 and the weights would never move. A length penalty (the trainer's reward
#: shaping, which the config allows with the synchronous loop only) makes rewards differ
#: within a group.
SHAPED = [
    "grpo.async_grpo.enabled=false",
    "grpo.reward_shaping.enabled=true",
    "grpo.reward_shaping.max_response_length=4",
    "grpo.reward_shaping.overlong_buffer_length=3",
    "grpo.reward_shaping.overlong_buffer_penalty=1.0",
]


def test_a_real_run_killed_mid_way_is_retrained_bit_for_bit(
    tmp_path, small_run, nats_server_factory
):
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    status_dir = run_dir / "status"
    process = start_run(run_dir, server.url, [*small_run, *SHAPED, f"grpo.max_num_steps={STEPS}"])
    try:
        # Checkpoints every 2 steps: killed at step 5, the trainer resumes from step 4's.
        wait_until(lambda: trainer_step(status_dir) >= 5, 240, "step 5")
        os.kill(pid_of(status_dir, "trainer"), signal.SIGKILL)
        finish(process, 300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    # The run's own data_plane (its hyperparams.json names the server): no --url needed.
    result = run_dockyard("replay", "retrain", "--run-dir", str(run_dir), "--from-step", "3")
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "reproduced bit for bit" in result.stdout
    report = json.loads((run_dir / "retrain" / f"steps_3-{STEPS}" / "retrain.json").read_text())
    assert [s["step"] for s in report["steps"]] == list(range(3, STEPS + 1))
    assert all(not s["differing"] and s["digest_equal"] for s in report["steps"])
    assert len({s["digest"] for s in report["steps"]}) == STEPS - 2  # the weights moved
