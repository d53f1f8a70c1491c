"""How a step's batch is cut into forward passes: fixed-size, by token budget, or packed.

Three plans, chosen by ``policy`` (the prev-logprob and reference passes use the ``logprob_*``
budgets, the training pass the ``train_*`` ones):

- **fixed** (default): ``train_micro_batch_size`` / ``logprob_batch_size`` samples in batch order,
  each micro-batch cut to its own longest sequence (right padding after a sequence never affects
  it under a causal mask, so the cut is exact).
- **dynamic batching** (``policy.dynamic_batching``): samples sorted by length, longest first, and
  grouped while ``count × round_up(longest, sequence_length_round)`` stays within the token
  budget; each micro-batch is padded to that rounded length (fewer distinct shapes for the
  kernels).
- **sequence packing** (``policy.sequence_packing``): samples bin-packed
  (:mod:`~dockyard.consumers.trainer.bin_packing`) into rows (see :func:`packed_plan` for their
  length), laid end to end with position ids that restart at 0 for each sample and no attention
  mask; rows are grouped into micro-batches of at most the token budget.
  Transformers reads restarting position ids as packed sequences and builds a block-diagonal
  causal mask from them (``masking_utils.find_packed_sequence_indices``; flash-attention's varlen
  path on GPU uses the same position ids), so no token attends across a sample boundary.

Every plan yields per-sample log-probs in the batch's own layout (``[n, columns]`` for the rows
``indices``, target ``t`` predicting token ``t+1`` of the sample), so the loss, advantages and
global normalisation never see how the forward passes were laid out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.config.sections.policy import PolicyConfig
from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.bin_packing import PackingAlgorithm, pack


@dataclass(frozen=True)
class MicroBatch:
    """One forward pass over the rows ``indices`` of the step's batch."""

    indices: torch.Tensor  # [n] long: rows of the step's batch
    columns: int  # target columns covered: the longest sample's length − 1 (at least 1)
    input_ids: torch.Tensor  # [R, T]
    attention_mask: torch.Tensor | None  # [R, T] padded plans; None when packed
    position_ids: torch.Tensor | None  # [R, T] packed plans: restart at 0 for each sample
    # Packed plans: for each sample and target column, the flat index into the pass's
    # ``[R × (T − 1)]`` next-token log-probs, and whether that target exists.
    gather_index: torch.Tensor | None = None  # [n, columns] long
    gather_valid: torch.Tensor | None = None  # [n, columns] bool
    # A vision-language pass: pixel_values, image_grid_thw and mm_token_type_ids of its rows'
    # images (see :mod:`.vision_batches`); None for a text pass.
    vision: dict[str, torch.Tensor] | None = None

    @property
    def size(self) -> int:
        return int(self.indices.numel())

    @property
    def num_tokens(self) -> int:
        """Tokens the forward pass runs over, padding included."""
        return int(self.input_ids.numel())


def sequence_lengths(batch: TrainingBatch) -> list[int]:
    """Tokens of each sample (right-padded rows: the attention mask's sum)."""
    return [int(n) for n in batch.attention_mask.sum(dim=-1).tolist()]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _padded(batch: TrainingBatch, indices: list[int], lengths: list[int], width: int) -> MicroBatch:
    longest = max(lengths[i] for i in indices)
    rows = torch.tensor(indices, dtype=torch.long)
    available = min(width, batch.input_ids.shape[1])
    input_ids = batch.input_ids[rows, :available]
    attention = batch.attention_mask[rows, :available]
    if width > available:
        # Rounded beyond the batch's own width: extra padding, masked out (its token id is
        # irrelevant: it is never attended to and never a target).
        input_ids = torch.nn.functional.pad(input_ids, (0, width - available))
        attention = torch.nn.functional.pad(attention, (0, width - available))
    return MicroBatch(
        indices=rows,
        columns=max(1, longest - 1),
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=None,
    )


def fixed_plan(batch: TrainingBatch, size: int) -> list[MicroBatch]:
    lengths = sequence_lengths(batch)
    plans = []
    for start in range(0, batch.size, size):
        indices = list(range(start, min(start + size, batch.size)))
        plans.append(_padded(batch, indices, lengths, max(2, max(lengths[i] for i in indices))))
    return plans


def dynamic_plan(batch: TrainingBatch, budget: int, round_to: int) -> list[MicroBatch]:
    lengths = sequence_lengths(batch)
    order = sorted(range(batch.size), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for index in order:
        # Longest first: the group's first sample sets its padded width.
        if groups:
            width = _round_up(max(2, lengths[groups[-1][0]]), round_to)
            if (len(groups[-1]) + 1) * width <= budget:
                groups[-1].append(index)
                continue
        if _round_up(max(2, lengths[index]), round_to) > budget:
            raise ValueError(
                f"a sequence of {lengths[index]} tokens, rounded up to a multiple of "
                f"sequence_length_round ({round_to}), exceeds the micro-batch token budget "
                f"{budget}; raise the budget or lower sequence_length_round"
            )
        groups.append([index])
    return [
        _padded(batch, group, lengths, _round_up(max(2, lengths[group[0]]), round_to))
        for group in groups
    ]


def packed_plan(
    batch: TrainingBatch, budget: int, algorithm: PackingAlgorithm, *, varlen: bool = False
) -> list[MicroBatch]:
    """Samples bin-packed into rows, rows grouped into micro-batches of at most ``budget`` tokens.

    With a variable-length attention kernel (``varlen``: flash-attention reads the sequence
    boundaries from the position ids and attends within each sample only) a row is the whole
    budget. Without one (SDPA / eager), the block-diagonal mask is applied to a full
    ``T × T`` score matrix, so a row is only as long as the batch's longest sample: attention
    then costs no more than padded rows, and the padding is gone.
    """
    lengths = sequence_lengths(batch)
    row = budget if varlen else min(budget, max(2, *lengths))
    bins = pack(lengths, row, algorithm)
    per_micro = max(1, budget // row)
    return [
        _packed(batch, bins[start : start + per_micro], lengths)
        for start in range(0, len(bins), per_micro)
    ]


def _packed(batch: TrainingBatch, rows: list[list[int]], lengths: list[int]) -> MicroBatch:
    indices = [index for row in rows for index in row]
    width = max(2, *(sum(lengths[i] for i in row) for row in rows))
    columns = max(1, max(lengths[i] for i in indices) - 1)
    input_ids = torch.zeros(len(rows), width, dtype=batch.input_ids.dtype)
    # Filler after a row's last sample restarts at 0 like a sample: a segment of its own.
    position_ids = torch.zeros(len(rows), width, dtype=torch.long)
    gather_index = torch.zeros(len(indices), columns, dtype=torch.long)
    gather_valid = torch.zeros(len(indices), columns, dtype=torch.bool)
    slot = 0
    for r, row in enumerate(rows):
        offset = 0
        filled = sum(lengths[i] for i in row)
        position_ids[r, filled:] = torch.arange(width - filled)
        for index in row:
            length = lengths[index]
            input_ids[r, offset : offset + length] = batch.input_ids[index, :length]
            position_ids[r, offset : offset + length] = torch.arange(length)
            targets = max(0, length - 1)
            # Next-token log-prob ``k`` of a row predicts its token ``k + 1``; in the flat
            # ``[R × (width − 1)]`` log-probs, target ``t`` of this sample sits at
            # ``r·(width − 1) + offset + t`` (its last token's prediction, which would cross
            # into the next sample, is never read).
            first = r * (width - 1) + offset
            gather_index[slot, :targets] = first + torch.arange(targets)
            gather_valid[slot, :targets] = True
            offset += length
            slot += 1
    return MicroBatch(
        indices=torch.tensor(indices, dtype=torch.long),
        columns=columns,
        input_ids=input_ids,
        attention_mask=None,
        position_ids=position_ids,
        gather_index=gather_index,
        gather_valid=gather_valid,
    )


def plan_micro_batches(
    batch: TrainingBatch, policy: PolicyConfig, purpose: str, *, varlen: bool = False
) -> list[MicroBatch]:
    """The forward passes for ``purpose`` ``"train"`` or ``"logprob"`` under ``policy``;
    ``varlen``: the model's attention is a variable-length kernel (see :func:`packed_plan`)."""
    train = purpose == "train"
    packing, dynamic = policy.sequence_packing, policy.dynamic_batching
    if packing.enabled:
        budget = policy.token_budget(train)  # train_mb_tokens / logprob_mb_tokens
        return packed_plan(batch, budget, packing.algorithm, varlen=varlen)
    if dynamic.enabled:
        budget = policy.token_budget(train)
        return dynamic_plan(batch, budget, dynamic.sequence_length_round)
    return fixed_plan(batch, policy.train_micro_batch_size if train else policy.logprob_batch_size)


def has_varlen_attention(model: torch.nn.Module) -> bool:
    """The model attends with flash-attention, whose kernels take packed sequences as such."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return isinstance(implementation, str) and implementation.startswith("flash_attention")


def micro_token_logprobs(
    model: torch.nn.Module, micro: MicroBatch, temperature: float = 1.0
) -> torch.Tensor:
    """``[n, columns]`` log-probs of each sample's next tokens (grad follows the caller)."""
    device = next(model.parameters()).device
    input_ids = micro.input_ids.to(device, non_blocking=True)
    if micro.position_ids is None:
        assert micro.attention_mask is not None
        mask = micro.attention_mask.to(device, non_blocking=True)
        vision = {
            name: value.to(device, non_blocking=True)
            for name, value in (micro.vision or {}).items()
        }
        # No KV cache: a scoring pass never decodes, and with a cache Transformers would not
        # read packed position ids as sequence boundaries.
        output = model(input_ids=input_ids, attention_mask=mask, use_cache=False, **vision)
    else:
        positions = micro.position_ids.to(device, non_blocking=True)
        output = model(input_ids=input_ids, position_ids=positions, use_cache=False)
    logprobs = next_token_logprobs(output.logits, input_ids, temperature)
    if micro.gather_index is None:
        return logprobs[:, : micro.columns]
    assert micro.gather_valid is not None
    flat = logprobs.reshape(-1)
    picked = flat[micro.gather_index.to(device).reshape(-1)].view_as(micro.gather_index)
    return torch.where(micro.gather_valid.to(device), picked, torch.zeros_like(picked))


def next_token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``[R, T-1]``: ``log p(input_ids[:, t+1] | …)`` under ``logits / temperature``."""
    return target_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


def target_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``[R, T]``: ``log p(targets[:, t])`` under ``logits[:, t] / temperature``.

    ``logit[target] − logsumexp(logits)``: the same value as gathering from ``log_softmax``,
    without materialising a second ``[R, T, V]`` tensor (and its saved copy for backward).
    """
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
