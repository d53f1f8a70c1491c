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

_INPUT_FIELDS = ("input_ids", "attention_mask")  # [B, L]; every other 2-D field is [B, L-1]


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
    # [B] bool, from the scores' flags: what grpo.invalid_tool_call_advantage and
    # grpo.malformed_thinking_advantage act on.
    invalid_tool_call: torch.Tensor | None = None
    malformed_thinking: torch.Tensor | None = None
    # [B] each sample's images (PNG files, in placeholder-run order); None: no sample has any.
    # Rows follow the batch through slice/take, so a micro-batch keeps its samples' images.
    images: tuple[tuple[bytes, ...], ...] | None = None

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

    def to(self, device: torch.device) -> TrainingBatch:
        """Every tensor on ``device`` (no copy for those already there)."""
        values = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device, non_blocking=True)
            values[item.name] = value
        return TrainingBatch(**values)

    def take(self, rows: torch.Tensor, columns: int | None = None) -> TrainingBatch:
        """The samples ``rows`` (any order), their per-token arrays cut to ``columns`` targets
        (and ``columns + 1`` input positions)."""
        index = rows.tolist()
        values = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, tuple):
                value = tuple(value[i] for i in index)
            elif isinstance(value, torch.Tensor):
                value = value[rows]
                if columns is not None and value.dim() == 2:
                    width = columns + 1 if item.name in _INPUT_FIELDS else columns
                    value = value[:, :width]
            values[item.name] = value
        return TrainingBatch(**values)


def build_batch(groups: Sequence[ScoredRollout], pad_token_id: int) -> TrainingBatch:
    """Stack every sample of ``groups`` (in order) into one batch.

    Reads the groups' columns (schema 3.0) directly: no per-sample model is built.
    """
    prompt_lengths = [n for group in groups for n in group.rollout.samples.prompt_lengths]
    response_lengths = [n for group in groups for n in group.rollout.samples.response_lengths]
    if not prompt_lengths:
        raise ValueError("cannot build a batch from no samples")
    lengths = [p + r for p, r in zip(prompt_lengths, response_lengths, strict=True)]
    width = max(2, max(lengths))  # at least one target column, even for empty sequences
    batch = len(lengths)
    input_ids = np.full((batch, width), pad_token_id, dtype=np.int64)
    attention = np.zeros((batch, width), dtype=np.int64)
    token_mask = np.zeros((batch, width - 1), dtype=np.float32)
    generation = np.zeros((batch, width - 1), dtype=np.float32)
    teacher_runs = [run for group in groups for run in group.scores.teacher_runs()]
    has_teacher = any(run is not None for run in teacher_runs)
    teacher = np.zeros((batch, width - 1), dtype=np.float32) if has_teacher else None
    versions = np.zeros(batch, dtype=np.int64)
    row = 0
    for group in groups:
        samples = group.rollout.samples
        offsets = samples.response_offsets()
        prompts = samples.prompts()
        for index in range(len(samples)):
            prompt_length, length = prompt_lengths[row], lengths[row]
            response = slice(offsets[index], offsets[index + 1])
            input_ids[row, :prompt_length] = prompts[index]
            input_ids[row, prompt_length:length] = samples.response_token_ids[response]
            attention[row, :length] = 1
            # Without a prompt the first response token predicts nothing: it has no target.
            skip = 1 if prompt_length == 0 else 0
            run = slice(response.start + skip, response.stop)
            targets = slice(prompt_length - 1 + skip, max(0, length - 1))
            token_mask[row, targets] = samples.loss_mask[run]
            generation[row, targets] = samples.behaviour_logprobs[run]
            sample_teacher = teacher_runs[row]
            if teacher is not None and sample_teacher is not None:
                teacher[row, targets] = sample_teacher[skip:]
            sample_versions = samples.token_weight_versions[response]
            versions[row] = int(sample_versions.min()) if sample_versions.size else 0
            row += 1
    return TrainingBatch(
        input_ids=torch.from_numpy(input_ids),
        attention_mask=torch.from_numpy(attention),
        token_mask=torch.from_numpy(token_mask),
        generation_logprobs=torch.from_numpy(generation),
        rewards=torch.tensor(
            [reward for group in groups for reward in group.scores.reward], dtype=torch.float32
        ),
        sample_mask=torch.ones(batch, dtype=torch.float32),
        min_weight_versions=torch.from_numpy(versions),
        group_ids=tuple(
            group_id
            for group in groups
            for group_id in [group.group_id] * len(group.rollout.samples)
        ),
        response_lengths=torch.tensor(response_lengths),
        truncated=torch.tensor(
            [
                reason == "length"
                for group in groups
                for reason in group.rollout.samples.finish_reason
            ]
        ),
        invalid_action=torch.tensor(
            [flag for group in groups for flag in group.scores.invalid_action]
        ),
        teacher_logprobs=torch.from_numpy(teacher) if teacher is not None else None,
        invalid_tool_call=_flagged(groups, "invalid_tool_call"),
        malformed_thinking=_flagged(groups, "malformed_thinking"),
        images=_images(groups),
    )


def _images(groups: Sequence[ScoredRollout]) -> tuple[tuple[bytes, ...], ...] | None:
    """[B] each sample's images; None when no sample has any (a text batch)."""
    images = tuple(
        tuple(group.rollout.samples.sample_images(index))
        for group in groups
        for index in range(len(group.rollout.samples))
    )
    return images if any(images) else None


def _flagged(groups: Sequence[ScoredRollout], flag: str) -> torch.Tensor:
    """[B] bool: which samples' scores carry ``flag``."""
    return torch.tensor(
        [flag in flags for group in groups for flags in group.scores.flags], dtype=torch.bool
    )
