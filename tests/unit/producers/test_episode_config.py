"""The multi-turn keys reach the parts they configure when a role is built from a config."""

from __future__ import annotations

import pytest

from dockyard.cli import CliError
from dockyard.commands._common import EXIT_INVALID_CONFIG
from dockyard.commands._roles import build_episode_runner, output_checks, prepare_rollout
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


SCREENSHOTS = "configs/cpu/grpo_osworld_screenshot.yaml"


def test_the_screenshot_preset_builds_episodes_that_show_images_within_its_limits():
    config = load_config(SCREENSHOTS, [])
    engine, _ = scripted_engine([])
    runner = build_episode_runner(config, engine, SamplingParams(max_new_tokens=8))
    assert runner is not None
    images = runner.images
    assert images.processor is not None  # the tiny Qwen2-VL's
    generation = config.policy.generation
    assert (images.limits.max_images_per_sample, images.limits.max_image_pixels) == (
        generation.max_images_per_sample,
        generation.max_image_pixels,
    )
    assert images.limits.allow_multimodal_inputs


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            [
                "policy.generation.backend=sglang",
                "policy.generation.sglang_cfg.server_urls=[http://127.0.0.1:1]",
            ],
            "the sglang engine does not forward images",
        ),
        (["policy.model_name=tiny://qwen2-bpe"], "'tiny://qwen2-bpe' has no image processor"),
        (
            ["grpo.structured_tool_use.tool_services=[osworld]", "data_plane.url=nats://x:4222"],
            "a tool service carries text only",
        ),
        (
            ["policy.tokenizer.chat_template=chatml"],
            "the chat template fails on tool messages",  # chatml joins text content only
        ),
    ],
)
def test_screenshots_a_run_could_not_show_are_refused_at_launch_with_the_key(overrides, says):
    config = load_config(SCREENSHOTS, overrides)
    with pytest.raises(CliError) as refused:
        prepare_rollout(config)
    assert refused.value.exit_code == EXIT_INVALID_CONFIG
    assert str(refused.value).startswith("env.osworld.observation_type=screenshot: ")
    assert says in str(refused.value)


def test_vllm_is_refused_for_screenshots_where_torchvision_is_missing():
    # vLLM 0.32's Qwen2-VL imports transformers' torchvision image processor; without
    # torchvision the engine cannot load the policy at all, so launch says why first.
    import importlib.util

    config = load_config(SCREENSHOTS, ["policy.generation.backend=vllm"])
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: vLLM may serve the policy")
    with pytest.raises(CliError, match="need torchvision, which is not installed"):
        prepare_rollout(config)
