"""Batch assembly (alignment of response tokens with next-token targets) and one GRPO step."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, token_logprobs
from dockyard.schemas import (
    DatasetPosition,
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleScore,
    SampleTimings,
    SamplingParams,
    ScoredRollout,
)

PAD = 0


def scored_group(
    group_id: str,
    prompt: list[int],
    responses: list[list[int]],
    rewards: list[float],
    images: list[bytes] | None = None,
) -> ScoredRollout:
    """``images``: every sample's (PNG files; the prompt group carries them too)."""
    group = PromptGroup(
        group_id=group_id,
        prompt_token_ids=np.array(prompt, dtype=np.int32),
        prompt_text="",
        environment="arithmetic",
        agent="test",
        num_generations=len(responses),
        dataset_position=DatasetPosition(dataset="d", epoch=0, index=0),
        dispatch_weight_version=0,
        trace_id=group_id,
        images=images or [],
    )
    samples = [
        RolloutSample(
            sample_index=index,
            prompt_token_ids=np.array(prompt, dtype=np.int32),
            response_token_ids=np.array(response, dtype=np.int32),
            behaviour_logprobs=np.full(len(response), -0.5, dtype=np.float32),
            token_weight_versions=np.full(len(response), 3 + index, dtype=np.int64),
            loss_mask=np.ones(len(response), dtype=np.uint8),
            finish_reason="stop",
            sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
            engine=EngineInfo(name="torch", version="test"),
            worker_id="w0",
            timings=SampleTimings(started_at_unix_s=time.time(), finished_at_unix_s=time.time()),
            images=images or [],
        )
        for index, response in enumerate(responses)
    ]
    rollout = Rollout(group=group, samples=samples)
    scores = [SampleScore(sample_index=i, reward=r) for i, r in enumerate(rewards)]
    return ScoredRollout(rollout=rollout, scores=scores, scorer_id="s0")


def test_response_tokens_align_with_their_targets():
    batch = build_batch(
        [
            scored_group("g1", [1, 5, 6], [[7, 2], [8, 9, 2]], [1.0, 0.0]),
            scored_group("g2", [1, 4], [[3]], [0.5]),
        ],
        PAD,
    )
    assert batch.input_ids.tolist() == [
        [1, 5, 6, 7, 2, PAD],
        [1, 5, 6, 8, 9, 2],
        [1, 4, 3, PAD, PAD, PAD],
    ]
    # Target t predicts input t+1: the response of row 0 (tokens at 3, 4) is targets 2, 3.
    assert batch.token_mask.tolist() == [
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 1, 0, 0, 0],
    ]
    assert batch.generation_logprobs[0, 2:4].tolist() == [-0.5, -0.5]
    assert batch.generation_logprobs[0, 4].item() == 0.0
    assert batch.group_ids == ("g1", "g1", "g2")
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    assert batch.min_weight_versions.tolist() == [3, 4, 3]


def test_token_logprobs_gather_the_next_token():
    torch.manual_seed(0)
    vocab = 11

    class Bigram(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.nn.Embedding(vocab, vocab)

        def forward(self, input_ids, attention_mask):
            return type("Out", (), {"logits": self.table(input_ids)})

    model = Bigram()
    batch = build_batch([scored_group("g", [1, 5], [[7, 2]], [1.0])], PAD)
    got = token_logprobs(model, batch)
    table = torch.log_softmax(model.table.weight, dim=-1)
    expected = [table[1, 5], table[5, 7], table[7, 2]]
    assert torch.allclose(got[0], torch.stack(expected))
    tempered = token_logprobs(model, batch, temperature=2.0)
    assert torch.allclose(tempered[0, 0], torch.log_softmax(model.table.weight[1] / 2, -1)[5])


@pytest.fixture(scope="module")
def quickstart():
    return load_config("configs/quickstart.yaml", ["policy.train_micro_batch_size=2"])


def test_a_step_raises_the_probability_of_rewarded_samples(quickstart):
    from dockyard.models import load_policy

    model, tokenizer = load_policy(quickstart.policy.model_name)
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "4567"]
    eos = tokenizer.eos_token_id
    prompt = tokenizer("12+34=")["input_ids"]
    good, bad = [digits[0], digits[2], eos], [digits[1], digits[3], eos]
    groups = [scored_group("g", prompt, [good, bad, good, bad], [1.0, 0.0, 1.0, 0.0])]
    batch = build_batch(groups, tokenizer.pad_token_id)
    trainer = PolicyTrainer(model, quickstart)
    before = trainer.batch_logprobs(model, batch)
    # The engine's log-probs are the model's own: an on-policy batch.
    batch = batch.__class__(**{**batch.__dict__, "generation_logprobs": before * batch.token_mask})
    for _ in range(3):
        outcome = trainer.step(batch)
    after = trainer.batch_logprobs(model, batch)
    gain = ((after - before) * batch.token_mask).sum(dim=-1)
    assert gain[0] > 0 and gain[2] > 0  # rewarded samples became more likely
    assert gain[1] < 0 and gain[3] < 0
    assert outcome.loss.num_valid_samples == pytest.approx(4.0)
    assert outcome.loss.num_valid_tokens == pytest.approx(12.0)


def test_filters_remove_truncated_and_disagreeing_samples(quickstart):
    from dockyard.models import load_policy

    model, tokenizer = load_policy(quickstart.policy.model_name)
    prompt = tokenizer("12+34=")["input_ids"]
    groups = [scored_group("g", prompt, [[5, 6, 2], [5, 6, 2], [5, 6, 7]], [1.0, 0.0, 0.0])]
    batch = build_batch(groups, tokenizer.pad_token_id)
    prev = torch.zeros_like(batch.generation_logprobs)  # engine reported -0.5 per token
    strict = load_config(
        "configs/quickstart.yaml",
        ["grpo.seq_logprob_error_threshold=1.5", "grpo.overlong_filtering=true"],
    )
    trainer = PolicyTrainer(model, strict)
    truncated = batch.__class__(**{**batch.__dict__, "truncated": torch.tensor([0, 0, 1]).bool()})
    # exp(mean |−0.5 − 0|) = 1.65 > 1.5: every sample disagrees; the last is also truncated.
    filtered, fraction = trainer.filter_samples(truncated, prev)
    assert filtered.sample_mask.tolist() == [0.0, 0.0, 0.0] and fraction == 1.0
    agreeing = prev + batch.generation_logprobs
    filtered, fraction = trainer.filter_samples(truncated, agreeing)
    assert filtered.sample_mask.tolist() == [1.0, 1.0, 0.0]
    assert fraction == pytest.approx(1 / 3)


def test_batches_from_columns_match_the_samples_they_hold():
    # Samples with prompts of their own, an empty response and teacher log-probs for one sample
    # only, read through the wire (the trainer's groups are decoded 3.0 columns).
    from dockyard.schemas import decode, encode

    base = scored_group("g", [1, 5], [[7, 2], [], [9, 9, 2]], [1.0, 0.0, 0.5])
    prompts = [[1, 5], [1, 4, 4, 6], [2]]
    samples = [
        msgspec.structs.replace(sample, **{"prompt_token_ids": np.array(prompt, dtype=np.int64)})
        for sample, prompt in zip(base.rollout.samples, prompts, strict=True)
    ]
    scores = [
        msgspec.structs.replace(
            score,
            **{"teacher_logprobs": np.array([-1.0, -2.0], dtype=np.float32)}
            if score.sample_index == 0
            else {},
        )
        for score in base.scores
    ]
    scored = ScoredRollout(
        rollout=Rollout(group=base.rollout.group, samples=samples), scores=scores, scorer_id="s0"
    )
    decoded = decode(None, encode(scored).payload, expected=ScoredRollout)
    assert not decoded.rollout.samples.prompt_shared
    batch = build_batch([decoded], PAD)
    assert batch.input_ids.tolist() == [[1, 5, 7, 2], [1, 4, 4, 6], [2, 9, 9, 2]]
    assert batch.token_mask.tolist() == [[0, 1, 1], [0, 0, 0], [1, 1, 1]]
    assert batch.teacher_logprobs is not None
    assert batch.teacher_logprobs[0, 1:3].tolist() == [-1.0, -2.0]
    assert batch.teacher_logprobs[2].abs().sum().item() == 0.0
    assert batch.response_lengths.tolist() == [2, 0, 3]
    assert batch.min_weight_versions.tolist() == [3, 0, 5]
    assert batch.rewards.tolist() == [1.0, 0.0, 0.5]
    # The same batch as from the group built in Python (its rows, not the wire's columns).
    local = build_batch([scored], PAD)
    assert torch.equal(local.input_ids, batch.input_ids)
    assert torch.equal(local.teacher_logprobs, batch.teacher_logprobs)


def test_samples_without_a_prompt_train_from_their_second_token():
    # A sample with no prompt tokens is valid on the wire; its first response token has no
    # prediction target, the others do. An empty sample yields an all-masked row.
    batch = build_batch(
        [scored_group("g", [], [[7, 2, 9], []], [1.0, 0.0]), scored_group("h", [1], [[5]], [0.5])],
        PAD,
    )
    assert batch.input_ids.tolist() == [[7, 2, 9], [PAD, PAD, PAD], [1, 5, PAD]]
    assert batch.token_mask.tolist() == [[1, 1], [0, 0], [1, 0]]
    assert batch.generation_logprobs[0].tolist() == [-0.5, -0.5]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 1, 0]]
