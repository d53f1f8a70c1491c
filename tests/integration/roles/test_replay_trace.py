"""``dockyard replay trace`` over what real roles stored on a real nats-server: a rollout the
scorer nak'ed once (its environment failed) and scored at the second delivery, and groups the
trainer dropped as stale."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.consumers.trainer.ledger import read_trail
from dockyard.environments.registry import build_environment
from tests.integration.roles.factories import prompt_group, rollout
from tests.integration.roles.test_scorer import (
    _count,
    registered_environment,
    running_scorer,
    wait_for,
)
from tests.unit.trainer.test_trainer_accounting import trainer


def _target(config) -> list[str]:  # type: ignore[no-untyped-def]
    return ["--url", config.url, "--namespace", config.namespace]


def test_a_rollout_nakked_once_then_scored_shows_the_answered_delivery(
    data_plane_config, capsys: pytest.CaptureFixture[str]
):
    calls = 0

    async def fail_first(group):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("verifier down")  # the scorer naks; the broker redelivers
        return await build_environment("arithmetic").score(group)

    registered_environment("flaky-for-trace", fail_first)
    group = msgspec.structs.replace(
        prompt_group("g-trace", 12, 34), **{"environment": "flaky-for-trace"}
    )

    async def scenario() -> int:
        async with JetStreamPlane(data_plane_config) as plane:
            messages = MessagePlane(plane, stage="test")
            ack = await messages.publish(rollout(group, ["46", "45"], version=3))
            async with running_scorer(messages):  # max_deliver=3, nak backoff from 0.1 s
                await wait_for(lambda: _count(plane, plane.names.scored, 1))
            return ack.seq

    rollout_seq = asyncio.run(scenario())
    assert calls == 2
    capsys.readouterr()  # the roles' logs
    assert main(["replay", "trace", "g-trace", "--json", *_target(data_plane_config)]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    assert [e["what"] for e in events] == ["rollout", "scored"]
    made, scored = events
    assert made["seq"] == rollout_seq
    assert made["detail"]["workers"] == ["w-test"] and made["detail"]["weight_versions"] == [3]
    assert made["detail"]["prompt"]["dataset"] == "test" and made["detail"]["prompt"]["index"] == 0
    assert scored["detail"]["answered_seq"] == rollout_seq
    assert scored["detail"]["answered_delivery"] == 2  # the first delivery was nak'ed
    assert scored["detail"]["scorer"] == "s-test"
    assert scored["detail"]["rewards"] == [1.0, 0.0]  # 12+34 = 46: the first answer only
    assert scored["seq"] > rollout_seq

    assert main(["replay", "trace", "g-trace", *_target(data_plane_config)]) == 0
    text = capsys.readouterr().out
    assert f"rollout #{rollout_seq}, delivery 2 (1 earlier deliveries not answered" in text


def test_a_group_dropped_as_stale_is_traced_to_the_ledgers_reason(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # Workers one refit late and an age limit of 1: some groups wait a step and are dropped
    # at age 2 (as in test_trainer_accounting).
    async def scenario() -> None:
        async with trainer(
            tmp_path,
            "grpo.max_num_steps=6",
            "grpo.async_grpo.max_trajectory_age_steps=1",
            versions_behind=1,
            data_plane=data_plane_config,
        ) as loop:
            await loop.run()

    asyncio.run(scenario())
    events = read_trail(tmp_path / "ledger.jsonl")
    dropped = [e["group_id"] for e in events if e["event"] == "dropped"]
    assert dropped, "the scenario must drop a group as stale"
    group_id = str(dropped[0])

    capsys.readouterr()  # the roles' logs
    target = [*_target(data_plane_config), "--run-dir", str(tmp_path)]
    assert main(["replay", "trace", group_id, "--json", *target]) == 0
    trace = json.loads(capsys.readouterr().out)["events"]
    assert [e["what"] for e in trace] == ["scored", "dropped"]
    scored, drop = trace
    assert drop["detail"] == {"reason": "stale: age 2 > 1"}
    assert drop["seq"] is None and drop["stream"] is None  # from the ledger, not a stream
    assert scored["detail"]["scorer"] == "stand-in"
    # The stand-in worker is one refit late: it generates with the dispatch version minus one.
    prompt = scored["detail"]["prompt"]
    assert scored["detail"]["weight_versions"] == [max(0, prompt["dispatch_weight_version"] - 1)]
    assert scored["detail"]["workers"] == ["w-test"]
    assert prompt["dataset"] and prompt["epoch"] == 0

    assert main(["replay", "trace", group_id, *target]) == 0
    text = capsys.readouterr().out
    assert "dropped" in text and "stale: age 2 > 1" in text and "ledger.jsonl" in text
