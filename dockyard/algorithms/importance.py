"""Importance-sampling correction from the behaviour policy (the engine) to π_old.

The engine sampled each token with log-prob ``gen``; the trainer's π_old assigns it ``prev``.
The off-policy weight ``w = π_old / π_gen = exp(prev − gen)`` is detached and multiplies the
clipped surrogate (``loss_fn.use_importance_sampling_correction``). The log-ratio is clamped to
±20 before ``exp`` (:mod:`dockyard.algorithms.ratios`: ``exp(100)`` is ``inf`` in float32, and
such a weight used to be zeroed, silently dropping the token); a non-finite log-ratio gives weight
0 (the token is dropped, never allowed to poison the sum).

Truncation (``loss_fn.truncated_importance_sampling_type``, bounds
``truncated_importance_sampling_ratio_min`` / ``truncated_importance_sampling_ratio``):

- ``tis``: clamp ``w`` to ``[min or 0, max]``;
- ``icepop``: keep ``w`` inside ``[min, max]``, zero it outside (masked IS);
- ``seq-mask-tis``: drop whole sequences whose geometric-mean weight
  ``exp(mean_t(prev − gen))`` lies outside ``[min, max]`` or is not finite (a token the engine
  gave probability zero); kept sequences keep their raw token weights.

With ``sequence_level_importance_ratios`` (GSPO) the weight is one per sequence, the *geometric
mean* ``exp(mean_t(prev − gen))``. The reference system uses ``exp(Σ_t(prev − gen))`` here, which
underflows (or overflows) on long responses — e.g. 0.0596 instead of 0.9999 on 8k tokens — and
then silently zeroes the sequence; this module never exponentiates a sum. A sequence with a
non-finite per-token log-ratio gets sequence weight 0.

Statistics are taken *before* truncation, and the fraction of weights truncated or masked is
reported (per token, or per sequence for sequence-level weights and ``seq-mask-tis``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.algorithms.masked import finite_or_zero, per_sequence_mean, zero_where_masked
from dockyard.algorithms.ratios import bounded_weight
from dockyard.config.sections.loss import ClippedPGLossConfig


@dataclass(frozen=True)
class ImportanceWeights:
    """Detached off-policy weights and what truncation did to them.

    ``weights`` is what multiplies the surrogate: ``[B, T]`` (token level) or ``[B, 1]``
    (sequence level); all ones when the correction is off. ``raw`` holds the weights before
    truncation over ``raw_mask``; ``truncated`` marks the entries of ``truncation_mask`` that
    truncation changed (clamped or zeroed).
    """

    weights: torch.Tensor
    raw: torch.Tensor
    raw_mask: torch.Tensor
    truncated: torch.Tensor
    truncation_mask: torch.Tensor
    per_sequence: bool
    truncation_per_sequence: bool


def sequence_geometric_mean_weight(
    prev_logprobs: torch.Tensor, generation_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``exp(mean_t(prev − gen))`` per sequence, ``[B]``: finite for any response length.

    A sequence holding a non-finite log-ratio on a valid token (the engine gave the token
    probability zero, or reported NaN) gets weight 0: its geometric mean is not finite, so it lies
    outside every bound and carries no trustworthy weight. Counting such a token as 0 (perfect
    agreement), as the reference's ``seq-mask-tis`` does, would keep exactly the sequences whose
    behaviour policy is most in doubt.
    """
    log_ratio = zero_where_masked(prev_logprobs - generation_logprobs, mask)
    all_finite = torch.isfinite(log_ratio).all(dim=-1)
    weight = bounded_weight(per_sequence_mean(finite_or_zero(log_ratio), mask))
    return torch.where(all_finite, weight, torch.zeros_like(weight))


def _truncate(raw: torch.Tensor, cfg: ClippedPGLossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``tis`` / ``icepop`` on element-wise weights: (truncated weights, changed?)."""
    high = cfg.truncated_importance_sampling_ratio
    assert high is not None  # guaranteed by ClippedPGLossConfig.rule_issues
    low = cfg.truncated_importance_sampling_ratio_min
    if cfg.truncated_importance_sampling_type == "tis":
        low_bound = 0.0 if low is None else low
        return raw.clamp(min=low_bound, max=high), (raw < low_bound) | (raw > high)
    assert low is not None
    kept = (raw >= low) & (raw <= high)
    return torch.where(kept, raw, torch.zeros_like(raw)), ~kept


def importance_weights(
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cfg: ClippedPGLossConfig,
) -> ImportanceWeights:
    """Off-policy weights for one micro-batch. ``mask`` is token mask × sample mask, ``[B, T]``."""
    prev = prev_logprobs.detach()
    gen = generation_logprobs.detach()
    mask = mask.bool()
    valid_sequences = mask.any(dim=-1, keepdim=True)
    kind = cfg.truncated_importance_sampling_type

    if cfg.sequence_level_importance_ratios:
        raw = sequence_geometric_mean_weight(prev, gen, mask).unsqueeze(-1)
        raw_mask = valid_sequences
    else:
        raw = bounded_weight(zero_where_masked(prev - gen, mask))
        raw_mask = mask

    if kind is None:
        weights, truncated, truncation_mask = raw, torch.zeros_like(raw_mask), raw_mask
    elif kind == "seq-mask-tis":
        low, high = (
            cfg.truncated_importance_sampling_ratio_min,
            cfg.truncated_importance_sampling_ratio,
        )
        assert low is not None and high is not None
        geo = sequence_geometric_mean_weight(prev, gen, mask).unsqueeze(-1)
        # A non-finite geometric mean arrives as weight 0, outside any bound (even min = 0).
        kept = (geo > 0) & (geo >= low) & (geo <= high)
        weights = raw * kept.to(raw.dtype)
        truncated, truncation_mask = ~kept, valid_sequences
    else:
        weights, truncated = _truncate(raw, cfg)
        truncation_mask = raw_mask

    if not cfg.use_importance_sampling_correction:
        weights = torch.ones_like(raw)
    return ImportanceWeights(
        weights=weights,
        raw=raw,
        raw_mask=raw_mask,
        truncated=truncated & truncation_mask,
        truncation_mask=truncation_mask,
        per_sequence=cfg.sequence_level_importance_ratios,
        truncation_per_sequence=cfg.sequence_level_importance_ratios or kind == "seq-mask-tis",
    )
