"""The multi-turn keys reach the parts they configure when a role is built from a config."""

from __future__ import annotations

from dockyard.commands._roles import build_episode_runner, output_checks
from dockyard.config.loader import load_config
from dockyard.engines.base import SamplingParams
from tests.unit.producers.scripted_policy import scripted_engine


def test_structured_tool_use_builds_an_episode_runner_from_its_keys():
    config = load_config(
        "configs/multiturn_tools.yaml",
        ["grpo.structured_tool_use.tool_call_format=openai", "grpo.max_rollout_turns=3"],
    )
    engine, _ = scripted_engine([])
    runner = build_episode_runner(config, engine, SamplingParams(max_new_tokens=8))
    assert runner is not None
    settings = runner.settings
    assert (settings.max_turns, settings.tool_call_format) == (3, "openai")
    assert (
        settings.max_tool_calls_per_turn == config.grpo.structured_tool_use.max_tool_calls_per_turn
    )
    assert settings.max_total_sequence_length == config.policy.max_total_sequence_length
    # The observation is encoded by the policy's own tokenizer.
    assert runner.codec.encode("12", add_special_tokens=False) == [3 + 1, 3 + 2]
    assert output_checks(config).tool_call_format == "openai"


def test_without_structured_tool_use_a_worker_generates_single_turn():
    config = load_config("configs/quickstart.yaml", ["grpo.malformed_thinking_advantage=-1.0"])
    engine, _ = scripted_engine([])
    assert build_episode_runner(config, engine, SamplingParams(max_new_tokens=8)) is None
    checks = output_checks(config)
    assert checks.tool_call_format is None and checks.thinking
