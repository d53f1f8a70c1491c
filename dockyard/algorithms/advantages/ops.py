"""Tensor math of the advantage estimators: group statistics by explicit group id, vectorised.

Group statistics use ``index_add_`` over a dense group index, so there is no Python loop over
samples or groups in the math (mapping string ids to indices is one pass over the ids).

Normalisation uses the plain *group* standard deviation over the group's valid samples, with
Bessel's correction. The reference system uses a leave-one-out std instead, which can be 0 for
one member of a varied group (``[1, 0, 0, 0]``: the first sample's siblings are all equal) and
then leaves that one advantage unnormalised while its siblings are divided — the group std
treats every member of a group alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from dockyard.algorithms.masked import zero_where_masked

NORMALIZATION_EPSILON = 1e-6
WHITENING_MIN_VARIANCE = 1e-8


def group_index(
    group_ids: torch.Tensor | Sequence[int] | Sequence[str], device: torch.device
) -> tuple[torch.Tensor, int]:
    """Dense indices ``[B]`` in ``0 .. G-1`` for explicit group ids, and ``G``."""
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dtype.is_floating_point or group_ids.dim() != 1:
            raise ValueError("group_ids must be a 1-D integer tensor, or a sequence of ids")
        unique, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(device), int(unique.numel())
    positions: dict[int | str, int] = {}
    dense = [positions.setdefault(group_id, len(positions)) for group_id in group_ids]
    return torch.tensor(dense, dtype=torch.long, device=device), len(positions)


@dataclass(frozen=True)
class GroupStats:
    """Per-sample views of its group's statistics over *valid* members, all ``[B]``."""

    count: torch.Tensor  # valid members in the sample's group
    mean: torch.Tensor
    std: torch.Tensor  # Bessel-corrected; exactly 0 for groups of fewer than 2 or not `varied`
    leave_one_out_mean: torch.Tensor  # mean of the other valid members (valid samples only)
    varied: torch.Tensor  # bool: the group's valid values are not all equal (exact comparison)


def group_stats(
    values: torch.Tensor, index: torch.Tensor, num_groups: int, valid: torch.Tensor
) -> GroupStats:
    dtype = values.dtype
    valid = valid.bool()
    valid_f = valid.to(dtype)
    x = zero_where_masked(values, valid)
    count = torch.zeros(num_groups, dtype=dtype, device=values.device).index_add_(0, index, valid_f)
    total = torch.zeros_like(count).index_add_(0, index, x)
    mean = total / count.clamp(min=1.0)
    deviation = zero_where_masked(values - mean[index], valid)
    squares = torch.zeros_like(count).index_add_(0, index, deviation.square())
    # Whether a group varies is decided by comparing its values, never from the computed std:
    # the mean of sixteen float32 0.7s is off by an ulp, which leaves a std of ~1e-8 that a
    # `std > 0` test would count as variance (and dividing by `std + ε` would magnify).
    highest = torch.full_like(count, -torch.inf).scatter_reduce_(
        0, index, torch.where(valid, values, -torch.inf), "amax"
    )
    lowest = torch.full_like(count, torch.inf).scatter_reduce_(
        0, index, torch.where(valid, values, torch.inf), "amin"
    )
    varied = highest > lowest
    std = torch.where(varied, torch.sqrt(squares / (count - 1.0).clamp(min=1.0)), 0.0)
    per_count = count[index]
    return GroupStats(
        count=per_count,
        mean=mean[index],
        std=std[index],
        leave_one_out_mean=(total[index] - x) / (per_count - 1.0).clamp(min=1.0),
        varied=varied[index],
    )


def group_relative_advantages(
    rewards: torch.Tensor,
    index: torch.Tensor,
    num_groups: int,
    valid: torch.Tensor,
    *,
    leave_one_out: bool,
    normalize: bool,
) -> torch.Tensor:
    """GRPO per sample ``[B]``: ``A = r − b`` (``b`` leave-one-out or group mean), divided by
    ``std + 1e-6`` where the group std is positive. Groups with ≤ 1 valid sample, groups whose
    valid rewards are all equal (whatever the dtype: the baseline's rounding is not signal), and
    invalid samples get exactly 0."""
    stats = group_stats(rewards, index, num_groups, valid)
    baseline = stats.leave_one_out_mean if leave_one_out else stats.mean
    advantages = rewards - baseline
    if normalize:
        advantages = torch.where(
            stats.std > 0, advantages / (stats.std + NORMALIZATION_EPSILON), advantages
        )
    return zero_where_masked(advantages, valid & (stats.count >= 2) & stats.varied)


def whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit (population) variance over the masked entries; masked-out entries → 0."""
    n = mask.to(values.dtype).sum().clamp(min=1.0)
    mean = zero_where_masked(values, mask).sum() / n
    variance = zero_where_masked((values - mean).square(), mask).sum() / n
    return zero_where_masked(
        (values - mean) * variance.clamp(min=WHITENING_MIN_VARIANCE).rsqrt(), mask
    )


def return_to_go(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Σ_{i ≥ t, valid} x_i`` at each valid token ``t`` of each row (``[B, T]``), else 0.

    Masked tokens (padding, a multi-turn episode's observations) neither add to a return nor get
    one: a reversed cumulative sum of the masked values."""
    kept = zero_where_masked(values, mask)
    return zero_where_masked(kept.flip(-1).cumsum(-1).flip(-1), mask)


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    index: torch.Tensor,
    num_groups: int,
    valid: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    minus_baseline: bool,
    kl_penalty_per_token: torch.Tensor | None = None,
) -> torch.Tensor:
    """REINFORCE++ ``[B, T]`` (arXiv 2501.03262): the outcome ``r`` (``r − mean_group(r)`` with
    ``minus_baseline``) minus, when KL is in the reward, the KL-penalised return to go
    ``β·Σ_{i ≥ t} KL_i`` over the sample's valid tokens, then whitened over all valid tokens of
    the batch (population variance).

    The return to go is the paper's (and verl's ``compute_reinforce_plus_plus_outcome_advantage``
    with γ = 1): the penalty is a per-token reward, so token ``t`` is credited with the KL of
    every token it leads to, not with its own KL alone."""
    centred = rewards - group_stats(rewards, index, num_groups, valid).mean
    per_sample = centred if minus_baseline else rewards
    advantages = per_sample.unsqueeze(-1).expand(token_mask.shape)
    if kl_penalty_per_token is not None:
        advantages = advantages - return_to_go(kl_penalty_per_token, token_mask.bool())
    return whiten(advantages, token_mask.bool() & valid.unsqueeze(-1))


def gdpo_advantages(
    components: Mapping[str, torch.Tensor],
    weights: Mapping[str, float] | None,
    index: torch.Tensor,
    num_groups: int,
    valid: torch.Tensor,
    *,
    leave_one_out: bool,
    normalize: bool,
) -> torch.Tensor:
    """GDPO ``[B]``: GRPO advantages per reward component (each normalised in its own group),
    weighted sum ``Σ_n w_n·A_n``, then normalised to zero mean / unit std over the samples that
    carry an advantage (valid, in a group of ≥ 2). Everything else stays 0."""
    if len(components) < 2:
        raise ValueError(
            f"gdpo needs at least two named reward components, got {sorted(components)}; "
            "use grpo.adv_estimator.name=grpo for a single reward"
        )
    if weights is not None and set(weights) != set(components):
        raise ValueError(
            f"grpo.adv_estimator.reward_weights names {sorted(weights)} but the reward "
            f"components are {sorted(components)}: give one weight per component"
        )
    combined: torch.Tensor | None = None
    for name in sorted(components):
        part = group_relative_advantages(
            components[name].detach(),
            index,
            num_groups,
            valid,
            leave_one_out=leave_one_out,
            normalize=normalize,
        )
        weighted = part * (1.0 if weights is None else weights[name])
        combined = weighted if combined is None else combined + weighted
    assert combined is not None
    first = next(iter(components.values()))
    eligible = valid & (group_stats(first, index, num_groups, valid).count >= 2)
    n = eligible.to(combined.dtype).sum()
    mean = zero_where_masked(combined, eligible).sum() / n.clamp(min=1.0)
    centred = combined - mean
    std = torch.sqrt(zero_where_masked(centred.square(), eligible).sum() / (n - 1.0).clamp(min=1.0))
    # As in group_stats: equal values are decided by comparison, not by a rounding-error std.
    varied = (
        torch.where(eligible, combined, -torch.inf).amax()
        > torch.where(eligible, combined, torch.inf).amin()
    )
    normalised = torch.where(
        varied & (std > 0), centred / std.clamp(min=torch.finfo(std.dtype).tiny), 0.0
    )
    return zero_where_masked(normalised, eligible)


def opd_advantages(
    teacher_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    valid: torch.Tensor,
) -> torch.Tensor:
    """On-policy distillation ``[B, T]``: ``sg[log π_teacher − prev]`` on valid tokens, else 0.

    Token-level: the teacher's log-prob of the sampled token only, not a full-vocabulary KL.
    """
    difference = teacher_logprobs.detach() - prev_logprobs.detach()
    return zero_where_masked(difference, token_mask.bool() & valid.unsqueeze(-1))


def require_finite(name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
    """Refuse non-finite inputs where they would be used (a NaN reward poisons its group)."""
    bad = int((~torch.isfinite(values) & mask.bool()).sum())
    if bad:
        raise ValueError(f"{name}: {bad} non-finite value(s) on valid entries")
