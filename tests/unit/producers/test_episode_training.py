"""Multi-turn episodes as the trainer sees them: observation tokens get no gradient, the loss is
the hand-computed one over model tokens only, and flagged samples get the configured advantage."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts, LossInputs
from dockyard.config.loader import load_config
from dockyard.config.sections.loss import ClippedPGLossConfig
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, token_logprobs
from dockyard.engines.base import SamplingParams
from dockyard.environments.tools.calculator import CalculatorToolbox
from dockyard.models.tiny import TinyModelSpec, build_tiny_model
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings
from dockyard.producers.rollout_assembly import build_episode_rollout
from dockyard.schemas import (
    DatasetPosition,
    EngineInfo,
    PromptGroup,
    SampleScore,
    ScoredRollout,
)
from tests.unit.producers.scripted_policy import scripted_engine

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'
TURNS = [CALC, "The answer is 42."]


def two_turn_group(num_generations: int = 2, flags: list[list[str]] | None = None):
    """A real group of two-turn episodes (scripted policy, real engine, real calculator)."""
    engine, tok = scripted_engine(TURNS)
    settings = EpisodeSettings(
        max_turns=3,
        tool_call_format="hermes",
        max_tool_calls_per_turn=4,
        max_total_sequence_length=512,
    )
    runner = EpisodeRunner(engine, SamplingParams(max_new_tokens=128), settings, tok)
    prompt = tok.encode("Question: what is 12 + 30?", add_special_tokens=False)
    group = PromptGroup(
        group_id="g0",
        prompt_token_ids=np.asarray(prompt, dtype=np.int32),
        prompt_text="Question: what is 12 + 30?",
        environment="calculator",
        agent="test",
        num_generations=num_generations,
        dataset_position=DatasetPosition(dataset="d", epoch=0, index=0),
        dispatch_weight_version=0,
        trace_id="g0",
    )
    runner.toolboxes["calculator"] = CalculatorToolbox()

    async def episodes():
        starts = await runner.open_group(group, [], delivery=1)
        return await runner.run(starts)

    rollout = build_episode_rollout(
        group,
        asyncio.run(episodes()),
        runner.params,
        engine=EngineInfo(name="torch", version="test"),
        worker_id="w0",
        started_at_unix_s=0.0,
    )
    flags = flags or [[] for _ in range(num_generations)]
    scores = [
        SampleScore(sample_index=i, reward=float(i == 0), flags=flags[i])
        for i in range(num_generations)
    ]
    return ScoredRollout(rollout=rollout, scores=scores, scorer_id="s0"), tok


def test_observation_tokens_get_exactly_zero_gradient_and_the_loss_is_the_hand_computed_one():
    scored, tok = two_turn_group()
    samples = scored.rollout.samples
    assert [s.role for s in samples[0].segments] == ["assistant", "tool", "assistant"]
    batch = build_batch([scored], tok.pad_token_id)
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelSpec(seed=0), tok)
    captured = {}

    def keep_logits(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = model.lm_head.register_forward_hook(keep_logits)
    logprobs = token_logprobs(model, batch)
    handle.remove()
    advantages = torch.tensor([1.0, 0.5])
    config = ClippedPGLossConfig(reference_policy_kl_penalty=0.0)
    loss, _ = ClippedPGLoss(config)(
        LossInputs(
            logprobs=logprobs,
            prev_logprobs=batch.generation_logprobs,
            generation_logprobs=batch.generation_logprobs,
            advantages=advantages,
            token_mask=batch.token_mask,
            sample_mask=batch.sample_mask,
        ),
        GlobalCounts.from_batch(batch.token_mask, batch.sample_mask),
    )
    loss.backward()

    # By hand, from the segments: every model token of both samples, none of the observation.
    prompt = samples[0].prompt_token_ids.tolist()
    terms = []
    with torch.no_grad():
        for index, sample in enumerate(samples):
            sequence = prompt + sample.response_token_ids.tolist()
            full = torch.log_softmax(model(torch.tensor([sequence])).logits[0], dim=-1)
            for segment in sample.segments:
                if segment.role != "assistant":
                    continue
                for j in range(segment.start, segment.end):
                    position = len(prompt) + j
                    lp = full[position - 1, sequence[position]]
                    ratio = torch.exp(lp - float(sample.behaviour_logprobs[j]))
                    a = advantages[index]
                    terms.append(torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2)))
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)

    grad = captured["logits"].grad  # [B, L, V]: position p predicts token p + 1
    for row, sample in enumerate(samples):
        for segment in sample.segments:
            predicting = range(len(prompt) - 1 + segment.start, len(prompt) - 1 + segment.end)
            norms = [float(grad[row, p].abs().sum()) for p in predicting]
            if segment.role == "tool":
                assert norms == [0.0] * len(norms)
            else:
                assert all(norm > 0.0 for norm in norms)
        # Prompt positions (predicting prompt tokens) get nothing either.
        assert float(grad[row, : len(prompt) - 1].abs().sum()) == 0.0


def test_flagged_samples_train_with_the_configured_advantage():
    config = load_config(
        "configs/quickstart.yaml",
        [
            "grpo.structured_tool_use.enabled=true",
            "grpo.invalid_tool_call_advantage=-1.0",
            "grpo.malformed_thinking_advantage=-0.25",
            "loss_fn.reference_policy_kl_penalty=0.0",
        ],
    )
    flags = [["invalid_tool_call"], ["malformed_thinking"], [], []]
    scored, tok = two_turn_group(4, flags)
    batch = build_batch([scored], tok.pad_token_id)
    trainer = PolicyTrainer(build_tiny_model(TinyModelSpec(seed=0), tok), config)
    prev = torch.zeros_like(batch.generation_logprobs)
    advantages = trainer.advantages(batch, prev, None)
    mask = batch.token_mask.bool()
    assert set(advantages[0][mask[0]].tolist()) == {-1.0}
    assert set(advantages[1][mask[1]].tolist()) == {-0.25}
    # Unflagged samples keep their GRPO advantage (rewards 0 and 0 against a group with a 1).
    assert all(v not in (-1.0, -0.25) for v in advantages[2][mask[2]].tolist())
    assert float(advantages[0][~mask[0]].abs().sum()) == 0.0  # observation tokens: none
