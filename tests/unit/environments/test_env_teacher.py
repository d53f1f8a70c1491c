"""The teacher environment: per-sample teacher choice and log-probs equal to a direct forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dockyard.config.sections.distillation import OnPolicyDistillationConfig
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoringGroup,
    build_environment,
)

VOCAB = 50


def _save_tiny_model(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def teachers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("teachers")
    return {
        "alpha": _save_tiny_model(root / "alpha", 1),
        "beta": _save_tiny_model(root / "beta", 2),
    }


def _distillation(teachers: dict[str, Path], **overrides: object) -> OnPolicyDistillationConfig:
    return OnPolicyDistillationConfig(
        enabled=True,
        teachers={
            alias: {"model_name": str(path), "precision": "float32"}
            for alias, path in teachers.items()
        },
        teacher_model_by_agent_name={"solver": "alpha", "coder": "beta"},
        default_teacher_alias="alpha",
        **overrides,
    )


def _direct_logprobs(path: Path, prompt: np.ndarray, response: np.ndarray) -> np.ndarray:
    model = Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.as_tensor(np.concatenate([prompt, response]))[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    logprobs = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logprobs[positions, torch.as_tensor(response)].numpy()


async def test_logprobs_match_a_direct_forward_and_teacher_follows_the_agent(
    teachers: dict[str, Path],
) -> None:
    context = EnvironmentContext(distillation=_distillation(teachers))
    context.env.teacher.batch_size = 2  # three samples: one full batch, one partial
    environment = build_environment("teacher", context)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, VOCAB, size=7)
    responses = [rng.integers(0, VOCAB, size=n) for n in (5, 11, 3)]
    group = ScoringGroup(
        group_id="opd-1",
        env_name="teacher",
        prompt_text="(tokens)",
        agent_name="coder",
        prompt_token_ids=prompt,
        samples=[
            SampleInput("", response_token_ids=responses[0]),
            SampleInput("", response_token_ids=responses[1], agent_name="solver"),
            SampleInput("", response_token_ids=responses[2], agent_name="someone-else"),
        ],
    )
    score = await environment.score(group)
    expected_teacher = ["beta", "alpha", "alpha"]  # group agent, sample agent, default
    for sample, response, alias in zip(score.samples, responses, expected_teacher, strict=True):
        assert sample.detail == f"teacher {alias}"
        assert sample.teacher_logprobs.shape == response.shape
        direct = _direct_logprobs(teachers[alias], prompt, response)
        np.testing.assert_allclose(sample.teacher_logprobs, direct, atol=1e-5)
        assert sample.components["teacher_logprob_mean"] == pytest.approx(
            float(direct.mean()), abs=1e-5
        )
        assert sample.reward == 0.0
    # The two teachers really differ, so choosing the wrong one would have failed above.
    other = _direct_logprobs(teachers["alpha"], prompt, responses[0])
    assert not np.allclose(score.samples[0].teacher_logprobs, other, atol=1e-3)


async def test_strict_matching_refuses_an_unknown_agent(teachers: dict[str, Path]) -> None:
    context = EnvironmentContext(distillation=_distillation(teachers, strict_agent_name_match=True))
    environment = build_environment("teacher", context)
    group = ScoringGroup(
        group_id="opd-2",
        env_name="teacher",
        prompt_text="",
        agent_name="stranger",
        prompt_token_ids=np.array([1, 2, 3]),
        samples=[SampleInput("", response_token_ids=np.array([4, 5]))],
    )
    with pytest.raises(InvalidScoringInput) as error:
        await environment.score(group)
    assert error.value.reason_code == "unknown_agent"


async def test_missing_token_ids_are_invalid_input(teachers: dict[str, Path]) -> None:
    environment = build_environment(
        "teacher", EnvironmentContext(distillation=_distillation(teachers))
    )
    group = ScoringGroup(
        group_id="opd-3", env_name="teacher", prompt_text="", samples=[SampleInput("text only")]
    )
    with pytest.raises(InvalidScoringInput, match="missing_tokens"):
        await environment.score(group)


def test_a_tiny_recipe_teacher_loads_as_the_policy_does():
    # The CPU preset of v4_consolidation.yaml names tiny:// teachers: built in code, the same
    # weights as `tiny://qwen2-bpe` loaded as a policy, in the precision asked for.
    from dockyard.environments.teacher_env import load_teacher
    from dockyard.models import load_policy

    teacher = load_teacher("tiny://qwen2-bpe", "bf16", "cpu")
    policy, _ = load_policy("tiny://qwen2-bpe", "bfloat16")
    assert next(teacher.parameters()).dtype == torch.bfloat16
    for (name, got), (_, expected) in zip(
        teacher.state_dict().items(), policy.state_dict().items(), strict=True
    ):
        assert torch.equal(got, expected), name
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        load_teacher("tiny://qwen2-bpe", "fp8", "cpu")
