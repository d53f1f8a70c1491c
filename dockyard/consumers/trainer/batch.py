"""Turning scored groups into padded training tensors.

Token-level arrays are aligned with *targets*: for a sequence ``s = prompt + response`` of length
``L``, position ``t`` of a ``[B, L-1]`` tensor is about predicting ``s[t+1]`` from ``s[:t+1]``.
Response token ``j`` of a sample whose prompt has ``p`` tokens therefore sits at ``p - 1 + j``.
Sequences are right-padded: with a causal mask, padding after a sequence never affects it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from dockyard.schemas import ScoredRollout


@dataclass(frozen=True)
class TrainingBatch:
    input_ids: torch.Tensor  # [B, L] long, right-padded
    attention_mask: torch.Tensor  # [B, L]
    token_mask: torch.Tensor  # [B, L-1] 1 where the target is a trained response token
    generation_logprobs: torch.Tensor  # [B, L-1] behaviour log-probs (0 elsewhere)
    rewards: torch.Tensor  # [B]
    sample_mask: torch.Tensor  # [B] 1 = sample takes part
    min_weight_versions: torch.Tensor  # [B] oldest weight version among its tokens
    group_ids: tuple[str, ...]  # [B] explicit group identity (never the prompt tokens)
    response_lengths: torch.Tensor  # [B] generated tokens per sample
    truncated: torch.Tensor  # [B] bool: stopped on the length limit
    invalid_action: torch.Tensor  # [B] bool: flagged by the environment
    teacher_logprobs: torch.Tensor | None = None  # [B, L-1] for on-policy distillation

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_response_tokens(self) -> int:
        return int(self.token_mask.sum().item())

    def slice(self, start: int, stop: int) -> TrainingBatch:
        values = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, torch.Tensor | tuple):
                value = value[start:stop]
            values[item.name] = value
        return TrainingBatch(**values)

    def micro_batches(self, size: int) -> Iterator[TrainingBatch]:
        for start in range(0, self.size, size):
            yield self.slice(start, min(start + size, self.size))


def build_batch(groups: Sequence[ScoredRollout], pad_token_id: int) -> TrainingBatch:
    """Stack every sample of ``groups`` (in order) into one batch."""
    samples = [
        (group, sample, score)
        for group in groups
        for sample, score in zip(group.rollout.samples, group.scores, strict=True)
    ]
    if not samples:
        raise ValueError("cannot build a batch from no samples")
    lengths = [len(s.prompt_token_ids) + len(s.response_token_ids) for _, s, _ in samples]
    width = max(lengths)
    batch = len(samples)
    input_ids = np.full((batch, width), pad_token_id, dtype=np.int64)
    attention = np.zeros((batch, width), dtype=np.int64)
    token_mask = np.zeros((batch, width - 1), dtype=np.float32)
    generation = np.zeros((batch, width - 1), dtype=np.float32)
    has_teacher = any(score.teacher_logprobs is not None for _, _, score in samples)
    teacher = np.zeros((batch, width - 1), dtype=np.float32) if has_teacher else None
    versions = np.zeros(batch, dtype=np.int64)
    for row, ((_, sample, score), length) in enumerate(zip(samples, lengths, strict=True)):
        prompt_length = len(sample.prompt_token_ids)
        response_length = len(sample.response_token_ids)
        input_ids[row, :prompt_length] = sample.prompt_token_ids
        input_ids[row, prompt_length:length] = sample.response_token_ids
        attention[row, :length] = 1
        targets = slice(prompt_length - 1, prompt_length - 1 + response_length)
        token_mask[row, targets] = sample.loss_mask
        generation[row, targets] = sample.behaviour_logprobs
        if teacher is not None and score.teacher_logprobs is not None:
            teacher[row, targets] = score.teacher_logprobs
        versions[row] = sample.min_weight_version() or 0
    return TrainingBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention),
        token_mask=torch.from_numpy(token_mask),
        generation_logprobs=torch.from_numpy(generation),
        rewards=torch.tensor([score.reward for _, _, score in samples], dtype=torch.float32),
        sample_mask=torch.ones(batch, dtype=torch.float32),
        min_weight_versions=torch.from_numpy(versions),
        group_ids=tuple(group.group_id for group, _, _ in samples),
        response_lengths=torch.tensor([len(s.response_token_ids) for _, s, _ in samples]),
        truncated=torch.tensor([s.finish_reason == "length" for _, s, _ in samples]),
        invalid_action=torch.tensor([score.invalid_action for _, _, score in samples]),
        teacher_logprobs=torch.from_numpy(teacher) if teacher is not None else None,
    )
