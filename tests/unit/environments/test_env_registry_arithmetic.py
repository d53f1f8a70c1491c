"""The registry, the timeout helper, and the quickstart's arithmetic environment."""

from __future__ import annotations

import asyncio

import pytest

from dockyard.config.sections.env import EnvSettings
from dockyard.environments import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    SampleInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
    UnknownEnvironmentError,
    available_environments,
    build_environment,
    environment_class,
    register_environment,
    score_with_timeout,
)


def _group(truth: object, *samples: SampleInput, env_name: str = "arithmetic") -> ScoringGroup:
    return ScoringGroup(
        group_id="g", env_name=env_name, prompt_text="12+30=", samples=samples, ground_truth=truth
    )


def test_builtin_environments_are_listed_and_unknown_names_say_what_exists() -> None:
    assert {"math", "arithmetic", "code", "swe", "teacher"} <= set(available_environments())
    with pytest.raises(UnknownEnvironmentError, match=r"unknown environment 'maths'.*math"):
        build_environment("maths")


class _SlowEnvironment(Environment):
    name = "test-slow"

    async def score(self, group: ScoringGroup) -> GroupScore:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_register_environment_adds_one_class_and_refuses_a_clash() -> None:
    register_environment(_SlowEnvironment)
    assert environment_class("test-slow") is _SlowEnvironment

    class Clash(_SlowEnvironment):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_environment(Clash)


async def test_score_with_timeout_gives_timeout_reward_and_flag() -> None:
    environment = _SlowEnvironment(EnvSettings(task_timeout=0.05, timeout_reward=-1.0))
    group = _group(1, SampleInput("a"), SampleInput("b"), env_name="test-slow")
    score = await score_with_timeout(environment, group)
    assert score.rewards == [-1.0, -1.0]
    assert all(sample.flags == {ScoreFlag.TIMEOUT} for sample in score.samples)
    overridden = await score_with_timeout(environment, group, timeout_s=0.01, timeout_reward=0.5)
    assert overridden.rewards == [0.5, 0.5]


async def test_score_with_timeout_passes_results_and_errors_through() -> None:
    environment = build_environment("arithmetic")
    score = await score_with_timeout(environment, _group(42, SampleInput("42")))
    assert score.rewards == [1.0]
    with pytest.raises(InvalidScoringInput):
        await score_with_timeout(environment, _group("forty-two", SampleInput("42")))


@pytest.mark.parametrize(
    ("response", "finish_reason", "reward", "flag"),
    [
        ("42", "stop", 1.0, None),
        ("42<eos>", None, 1.0, None),
        ("42</s>garbage after eos", None, 1.0, None),
        (" 42 ", "stop", 1.0, None),
        ("042", "stop", 1.0, None),  # integer equality, leading zero
        ("43", "stop", 0.0, None),
        ("4 2", "stop", 0.0, ScoreFlag.INVALID_ACTION),
        ("42.0", "stop", 0.0, ScoreFlag.INVALID_ACTION),  # digits only, per the task
        ("", "stop", 0.0, ScoreFlag.INVALID_ACTION),
        ("42", "length", 0.0, ScoreFlag.TRUNCATED),  # no EOS: not an answer
        ("4242424242", "length", 0.0, ScoreFlag.TRUNCATED),
    ],
)
async def test_arithmetic_exact_integer_before_eos(
    response: str, finish_reason: str | None, reward: float, flag: ScoreFlag | None
) -> None:
    environment = build_environment("arithmetic")
    score = await environment.score(
        _group("42", SampleInput(response, finish_reason=finish_reason))
    )
    sample: SampleScore = score.samples[0]
    assert sample.reward == reward
    assert sample.components["correct"] == reward
    assert sample.flags == (frozenset({flag}) if flag else frozenset())


@pytest.mark.parametrize(
    ("final_turn", "reward"), [("1776<|endoftext|>", 1.0), ("1777<|endoftext|>", 0.0)]
)
def test_an_episode_is_judged_by_its_last_model_turn(final_turn: str, reward: float) -> None:
    # The calculator episode: the call, the observation (which holds the product), the answer.
    # Only the model's last turn answers; the observation's number is the tool's, not the model's.
    episode = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'
        "<|endoftext|><tool_response>\n1776\n</tool_response>\n" + final_turn
    )
    sample = SampleInput(
        response_text=episode, finish_reason="stop", tool_calls=[], final_turn_text=final_turn
    )
    env = build_environment("arithmetic")
    score = asyncio.run(env.score(_group("1776", sample)))
    assert score.rewards == [reward]
