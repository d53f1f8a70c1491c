"""A run whose experience stream fills loses nothing (issue 44, "Faults in a running fleet").

The chaos run: with a small ``data_plane.streams.max_bytes`` the experience stream's ``discard:
old`` deleted groups the broker had acknowledged before any scorer or the trainer read them,
and the trainer blamed the dispatcher. Here the real ``dockyard run`` of the quickstart fills a
64 KiB experience stream several times over on a real nats-server: every dispatched group must be
trained exactly once or be open at the end (the run's own steps ran out), none dropped as lost.
"""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from dockyard.consumers.trainer.ledger import read_trail
from tests.integration.e2e.ledger_checks import assert_every_group_accounted, assert_exactly_once
from tests.integration.e2e.test_faults import finish, start_run

pytestmark = pytest.mark.slow

STEPS = 12
#: Each group stores a raw and a scored rollout of about 1.1 KiB: 12 steps of 4 groups store
#: ≈ 105 KiB, while what the run needs at once — 8 groups in flight and 2 steps since a
#: checkpoint, docs/operations.md's sizing rule — is ≈ 36 KiB. (Below that rule a run can stall,
#: and its starvation error then names the full stream.)
MAX_BYTES = 64 * 1024


async def experience_first_seq(url: str) -> int:
    client = await nats.connect(url)
    try:
        info = await client.jetstream().stream_info("dockyard_experience")
        return int(info.state.first_seq)
    finally:
        await client.close()


def logged_events(path) -> list[str]:  # type: ignore[no-untyped-def]
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line).get("event", ""))
        except json.JSONDecodeError:
            continue
    return events


def test_a_run_that_fills_its_experience_stream_trains_every_group_once(
    tmp_path, small_run, nats_server_factory
):
    server = nats_server_factory()
    run_dir = tmp_path / "run"
    process = start_run(
        run_dir,
        server.url,
        [
            *small_run,
            f"grpo.max_num_steps={STEPS}",
            "grpo.val_period=0",
            "grpo.val_at_start=false",
            f"data_plane.streams.max_bytes={MAX_BYTES}",
        ],
    )
    try:
        finish(process, 400)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    # Nothing acknowledged was lost: every group trained once or open at the run's end.
    assert_every_group_accounted(run_dir)
    events = read_trail(run_dir / "ledger.jsonl")
    lost = [e for e in events if e["event"] == "dropped" and "lost" in e["reason"]]
    assert not lost, lost[:3]
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * 4
    # The stream did fill, and the trainer trimmed the history it no longer needed (the stream
    # no longer starts at sequence 1). Whether a publisher met the full stream before a trim
    # is timing (the refusal and the wait are tests/integration/broker/test_stream_full.py's).
    logs = run_dir / "logs"
    assert "trainer.history_trimmed" in logged_events(logs / "trainer.log")
    assert asyncio.run(experience_first_seq(server.url)) > 1
