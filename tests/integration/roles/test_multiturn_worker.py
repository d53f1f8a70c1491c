"""The rollout worker running multi-turn episodes against a real nats-server: a rollout with
turns as segments and observations masked; a tool service that goes away fails the episodes,
the group is redelivered and replayed from scratch in fresh sessions, and published once;
``max_generation_failures`` lets a group through with its failed episodes untrained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec
import numpy as np

from dockyard.config.sections.env import EnvConfig, SandboxLimits, TerminalBenchEnvConfig
from dockyard.consumers.score_conversion import to_scoring_group
from dockyard.engines.base import SamplingParams
from dockyard.environments import EnvironmentContext, build_environment
from dockyard.environments.tools.toolbox import (
    Toolbox,
    ToolServiceUnavailable,
    ToolSession,
    register_toolbox,
)
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings
from dockyard.schemas import DeadLetter, FinishReason, decode
from tests.integration.roles.factories import prompt_group
from tests.integration.roles.test_rollout_worker import (
    _dead_letters,
    _has_rollouts,
    rollouts,
    running_worker,
    wait_for,
    with_weights,
)
from tests.unit.producers.scripted_policy import scripted_engine

CALL = '<tool_call>{"name": "lookup", "arguments": {"key": "answer"}}</tool_call>'


class OutageSession(ToolSession):
    def __init__(self, toolbox: type[OutageTools], episode_id: str) -> None:
        self.toolbox, self.episode_id = toolbox, episode_id

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({"lookup"})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        delivery, sample = self.episode_id.split(":")[-2:]
        if (delivery, sample) in self.toolbox.down or (delivery, "*") in self.toolbox.down:
            raise ToolServiceUnavailable("tool service connection lost")
        return "42"

    async def aclose(self) -> None:
        self.toolbox.closed.append(self.episode_id)


@register_toolbox
class OutageTools(Toolbox):
    """A lookup tool whose service is down for the (delivery, sample) pairs in ``down``."""

    name = "outage_tools"
    down: ClassVar[set[tuple[str, str]]] = set()
    opened: ClassVar[list[str]] = []
    closed: ClassVar[list[str]] = []

    async def open_session(self, episode_id: str, task: Mapping[str, Any]) -> ToolSession:
        self.opened.append(episode_id)
        return OutageSession(type(self), episode_id)


def tool_group(group_id: str, generations: int = 2):
    group = prompt_group(group_id, generations=generations)
    return msgspec.structs.replace(group, environment="outage_tools")


def episode_runner(engine, tok, max_turns: int = 3) -> EpisodeRunner:
    settings = EpisodeSettings(
        max_turns=max_turns,
        tool_call_format="hermes",
        max_tool_calls_per_turn=2,
        max_total_sequence_length=256,
    )
    return EpisodeRunner(engine, SamplingParams(max_new_tokens=64), settings, tok)


async def test_a_multi_turn_rollout_is_published_with_its_turns(data_plane_config):
    OutageTools.down, OutageTools.opened, OutageTools.closed = set(), [], []
    engine, tok = scripted_engine([CALL, "The answer is 42."])
    async with with_weights(data_plane_config, engine.model.state_dict()) as (
        plane,
        messages,
        store,
    ):
        await messages.publish(tool_group("g-turns"))
        async with running_worker(
            plane, store, engine, episodes=episode_runner(engine, tok), nak_delay_s=0.05
        ):
            await wait_for(lambda: _has_rollouts(plane, 1))
        [rollout] = await rollouts(plane)
    for sample in rollout.samples:
        assert [s.role for s in sample.segments] == ["assistant", "tool", "assistant"]
        tool = sample.segments[1]
        assert sample.loss_mask[tool.start : tool.end].sum() == 0
        assert sample.loss_mask.sum() == len(sample.loss_mask) - (tool.end - tool.start)
        assert [c.result for c in sample.tool_calls] == ["42"]
        assert sample.finish_reason is FinishReason.STOP
    assert sorted(OutageTools.closed) == sorted(OutageTools.opened)  # every sandbox discarded


async def test_a_lost_tool_service_replays_the_group_from_scratch_and_publishes_it_once(
    data_plane_config,
):
    # Delivery 1: the service is lost under sample 1. Delivery 2: it is back.
    OutageTools.down, OutageTools.opened, OutageTools.closed = {("d1", "s1")}, [], []
    engine, tok = scripted_engine([CALL, "The answer is 42."])
    async with with_weights(data_plane_config, engine.model.state_dict()) as (
        plane,
        messages,
        store,
    ):
        await messages.publish(tool_group("g-outage"))
        async with running_worker(
            plane, store, engine, episodes=episode_runner(engine, tok), nak_delay_s=0.05
        ) as worker:
            await wait_for(lambda: _has_rollouts(plane, 1))
            assert worker.failed_episodes == 1
        [rollout] = await rollouts(plane)
        assert (await plane.consumer_lag(plane.names.prompt_consumer)).backlog == 0
    # Both episodes ran again in new sessions: nothing of delivery 1 reached the rollout.
    assert sorted(OutageTools.opened) == [
        "g-outage:0:d1:s0",
        "g-outage:0:d1:s1",
        "g-outage:0:d2:s0",
        "g-outage:0:d2:s1",
    ]
    assert [s.finish_reason for s in rollout.samples] == [FinishReason.STOP] * 2


async def test_failures_within_max_generation_failures_publish_the_group_untrained(
    data_plane_config,
):
    OutageTools.down, OutageTools.opened, OutageTools.closed = {("d1", "s0")}, [], []
    engine, tok = scripted_engine([CALL, "The answer is 42."])
    async with with_weights(data_plane_config, engine.model.state_dict()) as (
        plane,
        messages,
        store,
    ):
        await messages.publish(tool_group("g-within", generations=3))
        async with running_worker(
            plane,
            store,
            engine,
            episodes=episode_runner(engine, tok),
            max_generation_failures=1,
        ):
            await wait_for(lambda: _has_rollouts(plane, 1))
        [rollout] = await rollouts(plane)
    failed, *fine = rollout.samples
    assert failed.finish_reason is FinishReason.ERROR
    assert not np.any(failed.loss_mask)  # cut short by the infrastructure: not trained on
    assert all(s.finish_reason is FinishReason.STOP and s.loss_mask.any() for s in fine)


BASH = '<tool_call>{"name": "bash", "arguments": {"command": "echo hello > hello.txt"}}</tool_call>'
HELLO = {"setup": "", "check": 'test "$(cat hello.txt)" = hello'}  # configs/cpu/data, tb-1


def terminal_group(group_id: str, extra: dict[str, str]):
    group = prompt_group(group_id)
    return msgspec.structs.replace(group, environment="terminal_bench", extra=extra)


async def test_terminal_episodes_run_commands_in_a_sandbox_and_the_scorer_rewards_them(
    data_plane_config,
):
    # The real terminal toolbox (sandboxed shell) under the worker, then the real scorer path.
    engine, tok = scripted_engine([BASH, "Done."])
    runner = EpisodeRunner(
        engine,
        SamplingParams(max_new_tokens=256),
        EpisodeSettings(2, "hermes", 1, 1024),
        tok,
        EnvConfig(terminal_bench=TerminalBenchEnvConfig(limits=SandboxLimits(wall_time_s=5))),
    )
    broken = {"setup": "exit 3", "check": "true"}
    async with with_weights(data_plane_config, engine.model.state_dict()) as (
        plane,
        messages,
        store,
    ):
        await messages.publish_many(
            [terminal_group("g-tb", HELLO), terminal_group("g-bad", broken)]
        )
        async with running_worker(plane, store, engine, episodes=runner, nak_delay_s=0.05):
            await wait_for(lambda: _has_rollouts(plane, 1))
            await wait_for(lambda: _dead_letters(plane, 1))
        [rollout] = await rollouts(plane)
        [dead] = [m async for m in plane.replay(plane.names.dead_letters)]
    # A task whose setup fails is the task's fault: dead-lettered at once, not replayed.
    letter = decode(dead.headers, dead.data, expected=DeadLetter)
    assert (letter.reason, letter.delivery_count) == ("setup_failed", 1)
    assert rollout.group_id == "g-tb"
    for sample in rollout.samples:
        [call] = sample.tool_calls
        assert (call.name, call.result) == ("bash", "[exit 0]")
    # The scorer replays the commands in a fresh sandbox and runs the task's check there.
    environment = build_environment(
        "terminal_bench", EnvironmentContext(env=EnvConfig(terminal_bench=TerminalBenchEnvConfig()))
    )
    score = await environment.score(to_scoring_group(rollout, tok))
    assert score.rewards == [1.0, 1.0]


@register_toolbox
class UnreachableTools(Toolbox):
    """A toolbox whose service never answers (a desktop simulator that was never started)."""

    name = "unreachable_tools"

    async def open_session(self, episode_id: str, task: Mapping[str, Any]) -> ToolSession:
        raise ToolServiceUnavailable("POST /desktops: ConnectError")


async def test_a_worker_whose_tool_service_is_down_says_so_on_its_status(data_plane_config):
    # The live table and a starving trainer read the roles' status: the cause is named there,
    # not only in the worker's log.
    engine, tok = scripted_engine([CALL, "The answer is 42."])
    group = msgspec.structs.replace(prompt_group("g-down"), environment="unreachable_tools")
    async with with_weights(data_plane_config, engine.model.state_dict()) as (
        plane,
        messages,
        store,
    ):
        await messages.publish(group)
        async with running_worker(
            plane, store, engine, episodes=episode_runner(engine, tok), nak_delay_s=0.05
        ) as worker:
            expected = "tool service unavailable: POST /desktops: ConnectError"

            async def reported() -> bool:
                return worker.status.status.detail == expected

            await wait_for(reported)
            assert worker.failed_episodes >= group.num_generations
