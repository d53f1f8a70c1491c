"""The scorer pool against a real nats-server: rollouts in, scored rollouts out; a crash
mid-task is redelivered and yields exactly one scored message; a poison rollout is a dead
letter and the scorer carries on."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

import msgspec
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.env import CodeEnvConfig, EnvConfig
from dockyard.consumers.score_conversion import to_scored_rollout, to_scoring_group
from dockyard.consumers.scorer import Scorer
from dockyard.environments.base import (
    EnvironmentContext,
    GroupScore,
    InvalidScoringInput,
    ScoreFlag,
)
from dockyard.environments.code_env import CodeEnvironment
from dockyard.environments.code_env import TestCase as CodeCase  # not a test class
from dockyard.environments.registry import build_environment
from dockyard.schemas import DeadLetter, Rollout, ScoredRollout, decode, encode
from tests.integration.broker.broker_test_utils import fetch_until
from tests.integration.broker.poison_headers import CORPUS, publish_poison
from tests.integration.roles.factories import TOKENIZER, prompt_group, rollout


async def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def stored(plane: JetStreamPlane, subject: str) -> list:
    return [m async for m in plane.replay(subject)]


@contextlib.asynccontextmanager
async def running_scorer(messages: MessagePlane, context: EnvironmentContext | None = None):
    scorer = Scorer(
        messages,
        context or EnvironmentContext(env=EnvConfig()),
        TOKENIZER,
        scorer_id="s-test",
        max_deliver=3,
        nak_delay_s=0.1,
    )
    task = asyncio.create_task(scorer.run())
    try:
        yield scorer
    finally:
        scorer.stop()
        await asyncio.wait_for(task, 10)


def registered_environment(name: str, score):
    """Registers, as ``name``, a test environment whose scoring is ``score`` (it counts its
    calls in ``calls``)."""
    from dockyard.environments.base import Environment
    from dockyard.environments.registry import register_environment

    class TestEnvironment(Environment):
        calls = 0

        @classmethod
        def from_context(cls, context):
            return cls(context.env.math)

        async def score(self, group):
            type(self).calls += 1
            return await score(group)

    TestEnvironment.name = name
    return register_environment(TestEnvironment)


async def test_rollouts_in_scored_rollouts_out(data_plane_config):
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="test")
        group = prompt_group("g-1", 12, 34, generations=3)
        await messages.publish(rollout(group, ["46", "45", "x"]))
        async with running_scorer(messages):
            await wait_for(lambda: _count(plane, plane.names.scored, 1))
        (message,) = await stored(plane, plane.names.scored)
        scored = decode(message.headers, message.data, expected=ScoredRollout)
        assert scored.group_id == "g-1"
        assert [s.reward for s in scored.scores] == [1.0, 0.0, 0.0]
        assert [s.invalid_action for s in scored.scores] == [False, False, True]
        lag = await plane.consumer_lag(plane.names.rollout_consumer)
        assert lag.backlog == 0  # acked after publishing


async def test_a_crash_mid_task_is_redelivered_and_scored_exactly_once(data_plane_config):
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="test")
        await messages.publish(rollout(prompt_group("g-crash"), ["46", "46"]))
        # A scorer takes the rollout, publishes its score, and dies before acking.
        (taken,) = await messages.fetch(plane.names.rollout_consumer, Rollout)
        environment = build_environment("arithmetic")
        score = await environment.score(to_scoring_group(taken.message, TOKENIZER))
        await messages.publish(to_scored_rollout(taken.message, score, "dead-scorer"))
        # After the ack wait, the survivor gets the redelivery and publishes the same id again.
        async with running_scorer(messages) as survivor:
            await wait_for(lambda: _backlog_zero(plane))
            assert sum(s.groups for s in survivor.stats.by_env.values()) == 1
            counters = survivor.status.status.counters
            assert counters["arithmetic/groups"] == 1 and counters["arithmetic/failures"] == 0
        assert len(await stored(plane, plane.names.scored)) == 1


async def test_a_poison_rollout_is_dead_lettered_and_the_scorer_continues(data_plane_config):
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        await plane.publish(plane.names.rollouts, b"\x28\xb5\x2f\xfdnot a frame", msg_id="poison")
        await messages.publish(rollout(prompt_group("g-after"), ["46", "40"]))
        async with running_scorer(messages):
            await wait_for(lambda: _count(plane, plane.names.scored, 1))
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1))
        (dead,) = await stored(plane, plane.names.dead_letters)
        letter = decode(dead.headers, dead.data, expected=DeadLetter)
        assert letter.reason == "corrupt_frame"
        assert letter.stage == "scorer"
        assert letter.original_subject == plane.names.rollouts


async def test_a_poison_header_is_dead_lettered_and_the_scorer_continues(data_plane_config):
    # Issue #17: a well-formed rollout under a non-numeric Dockyard-Chunks header took the
    # scorer down on every restart. The data plane refuses it (docs/wire-format.md,
    # "Malformed headers"): the scorer never sees it and scores what comes next.
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        poison = rollout(prompt_group("g-poison"), ["46", "40"])
        await publish_poison(plane, plane.names.rollouts, poison, CORPUS[0], "poison")
        await messages.publish(rollout(prompt_group("g-after"), ["46", "40"]))
        async with running_scorer(messages):
            await wait_for(lambda: _count(plane, plane.names.scored, 1))
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1))
        (scored,) = await stored(plane, plane.names.scored)
        assert decode(scored.headers, scored.data, expected=ScoredRollout).group_id == "g-after"
        (dead,) = await stored(plane, plane.names.dead_letters)
        letter = decode(dead.headers, dead.data, expected=DeadLetter)
        assert (letter.reason, letter.stage) == ("bad_header", "data_plane")
        assert letter.original_payload == encode(poison).payload


async def test_an_unknown_environment_is_a_dead_letter_not_a_retry(data_plane_config):
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="test")
        group = msgspec.structs.replace(prompt_group("g-unknown"), **{"environment": "nonexistent"})
        await messages.publish(rollout(group, ["46", "46"]))
        async with running_scorer(messages) as scorer:
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1))
            assert scorer.stats.dead_lettered


async def _count(plane: JetStreamPlane, subject: str, expected: int) -> bool:
    return len(await stored(plane, subject)) >= expected


async def _backlog_zero(plane: JetStreamPlane) -> bool:
    lag = await plane.consumer_lag(plane.names.rollout_consumer)
    return lag.backlog == 0


async def test_an_environment_failure_is_retried_then_dead_lettered(data_plane_config):
    async def crash(group):  # a bug, an unreachable service
        raise RuntimeError("verifier crashed")

    exploding = registered_environment("exploding-for-test", crash)

    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        group = msgspec.structs.replace(
            prompt_group("g-explodes"), **{"environment": "exploding-for-test"}
        )
        await messages.publish(rollout(group, ["46", "46"]))
        async with running_scorer(messages) as scorer:  # max_deliver=3, backoff from 0.1 s
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1))
            assert scorer.stats.by_env["exploding-for-test"].failures == 3
        assert exploding.calls == 3  # tried once per delivery, then given up
        (dead,) = await stored(plane, plane.names.dead_letters)
        letter = decode(dead.headers, dead.data, expected=DeadLetter)
        assert letter.reason == "environment_error"
        assert "verifier crashed" in letter.message
        assert await stored(plane, plane.names.scored) == []


async def test_scoring_longer_than_the_ack_wait_is_not_given_to_another_scorer(
    data_plane_config,
):
    async def slowly(group):  # a slow sandbox: 3 ack waits
        await asyncio.sleep(3 * data_plane_config.consumer.ack_wait_s)  # the work itself
        return await build_environment("arithmetic").score(group)

    slow = registered_environment("slow-for-test", slowly)

    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        group = msgspec.structs.replace(prompt_group("g-slow"), **{"environment": "slow-for-test"})
        await messages.publish(rollout(group, ["46", "46"]))
        async with running_scorer(messages), running_scorer(MessagePlane(plane, stage="scorer")):
            await wait_for(lambda: _count(plane, plane.names.scored, 1))
        assert slow.calls == 1  # the pool's other scorer never got it
        assert await stored(plane, plane.names.dead_letters) == []
        assert len(await stored(plane, plane.names.scored)) == 1


async def test_a_failed_publish_of_the_score_naks_the_group_for_later(data_plane_config):
    from dockyard.broker.plane import PublishError

    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        await messages.publish(rollout(prompt_group("g-publish"), ["46", "46"]))
        publish = messages.publish
        refusals = [PublishError("stand-in: the broker refused the publish")]

        async def refuse_once(message, **provenance):  # a broker that refuses once
            if refusals:
                raise refusals.pop()
            return await publish(message, **provenance)

        messages.publish = refuse_once  # type: ignore[method-assign]
        async with running_scorer(messages) as scorer:
            await wait_for(lambda: _count(plane, plane.names.scored, 1))
            assert scorer.stats.by_env["arithmetic"].failures == 1
        scored = await stored(plane, plane.names.scored)
        assert len(scored) == 1
        assert await stored(plane, plane.names.dead_letters) == []


async def _score_anyway(group):
    return await build_environment("arithmetic").score(group)


async def _refuse(group):
    raise InvalidScoringInput("missing_ground_truth", "stand-in for an unusable group")


@pytest.mark.parametrize(
    ("then", "reported_as"),
    [
        (_score_anyway, "settle.unreachable"),  # the score cannot be sent; nor the nak after it
        (_refuse, "task.failed"),  # the dead letter cannot be sent: the task itself fails
    ],
)
@pytest.mark.slow
async def test_a_scorer_that_loses_its_connection_mid_task_runs_on(
    data_plane_config, then, reported_as
):
    # Issue #17: a scorer whose settle met a closed connection died of an exception in a task
    # nobody awaited ("Task exception was never retrieved") and exited 1.
    unobserved: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unobserved.append(context))
    try:
        async with (
            JetStreamPlane(data_plane_config) as plane,
            JetStreamPlane(data_plane_config) as scorer_plane,
        ):

            async def lose_the_connection(group):
                await scorer_plane.nc.close()
                return await then(group)

            environment = f"closing-for-test-{then.__name__}"
            registered_environment(environment, lose_the_connection)
            group = msgspec.structs.replace(
                prompt_group("g-closing"), **{"environment": environment}
            )
            await MessagePlane(plane, stage="test").publish(rollout(group, ["46", "46"]))
            with capture_logs() as events:
                async with running_scorer(MessagePlane(scorer_plane, stage="scorer")) as scorer:
                    await wait_for(lambda: _logged(events, reported_as))
                    # Nothing lost: the broker gives the group to the next scorer that asks.
                    (again,) = await fetch_until(plane, plane.names.rollout_consumer, 1)
                    assert again.num_delivered == 2
                    assert not scorer.stopping.is_set()
                # running_scorer stops it and waits: the scorer ran on and stops cleanly.
        gc.collect()  # a failed task nobody awaited is reported when it is collected
        assert unobserved == []
    finally:
        loop.set_exception_handler(previous_handler)


async def _logged(events: list[dict[str, object]], name: str) -> bool:
    return any(event["event"] == name for event in events)


async def test_a_suspected_reward_hack_is_scored_zero_and_dead_lettered_with_evidence(
    data_plane_config,
):
    # The code environment's own screen decides (real CodeEnvironment.score_program); the
    # character tokenizer cannot spell a program, so the environment is handed the programs.
    code = CodeEnvironment(CodeEnvConfig())
    cases = [CodeCase(stdin="2 3\n", expected_stdout="5\n")]
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)\n",
        "import os, sys\nframe = sys._getframe()\nos._exit(frame.f_back is None)\n",
    ]

    async def score(group):
        samples = [code.score_program(program, cases) for program in programs]
        return GroupScore(group_id=group.group_id, samples=samples)

    registered_environment("screened-for-test", score)
    labels = {"stage": "scorer", "reason": "suspected_reward_hack"}

    def reported() -> float:
        return REGISTRY.get_sample_value("dockyard_dead_letters_total", labels) or 0.0

    before = reported()
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="scorer")
        group = msgspec.structs.replace(
            prompt_group("g-hack"), **{"environment": "screened-for-test"}
        )
        await messages.publish(rollout(group, ["46", "46"]))
        async with running_scorer(messages) as scorer:
            await wait_for(lambda: _count(plane, plane.names.scored, 1))
            await wait_for(lambda: _count(plane, plane.names.dead_letters, 1))
            assert scorer.stats.by_env["screened-for-test"].suspected_reward_hacks == 1
            counters = scorer.status.status.counters
            assert counters["screened-for-test/suspected_reward_hacks"] == 1
        (message,) = await stored(plane, plane.names.scored)
        scored = decode(message.headers, message.data, expected=ScoredRollout)
        assert [s.reward for s in scored.scores] == [1.0, 0.0]
        assert ScoreFlag.SUSPECTED_REWARD_HACK in scored.scores[1].flags
        (dead,) = await stored(plane, plane.names.dead_letters)
        letter = decode(dead.headers, dead.data, expected=DeadLetter)
        assert (letter.reason, letter.stage) == ("suspected_reward_hack", "scorer")
        assert "sample 1: suspected reward hack: frame_walking at program.py:2" in letter.message
        assert letter.original_subject == plane.names.rollouts
        assert await _backlog_zero(plane)  # scored and acked, not refused
    assert reported() == before + 1  # the dead-letter metric, by reason
