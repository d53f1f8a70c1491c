"""Masked reductions over ``[B, T]`` tensors, normalised by *global* counts.

Every loss term is reduced by dividing a micro-batch's masked sum by a count taken over the whole
batch (all micro-batches, all data-parallel ranks). Summing the micro-batch results therefore
gives exactly the full-batch value, which is what makes gradient accumulation exact.

Masked positions are *selected away* with ``torch.where`` rather than multiplied by zero, so a
NaN or ``inf`` sitting in padding never leaks into a sum (``nan * 0`` is ``nan``).
"""

from __future__ import annotations

import torch


def zero_where_masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is set, else 0 (gradient is 0 there, and never NaN)."""
    return torch.where(
        mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device)
    )


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    selected = zero_where_masked(values, mask)
    return selected.sum() if dim is None else selected.sum(dim=dim)


def per_sequence_mean(values: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Mean over each row's unmasked tokens: ``[B, T] -> [B]``; a row with no tokens gives 0."""
    counts = token_mask.to(values.dtype).sum(dim=-1).clamp(min=1.0)
    return masked_sum(values, token_mask, dim=-1) / counts


def token_level_reduce(
    values: torch.Tensor, mask: torch.Tensor, global_valid_tokens: float
) -> torch.Tensor:
    """``Σ_valid x / N_tokens(global)``."""
    return masked_sum(values, mask) / max(float(global_valid_tokens), 1.0)


def sequence_level_reduce(
    values: torch.Tensor, mask: torch.Tensor, global_valid_sequences: float
) -> torch.Tensor:
    """Mean over each sequence's valid tokens, then ``Σ_valid sequences / N_sequences(global)``.

    ``mask`` is the combined token × sample mask: a masked-out sample has no valid token and so
    contributes 0 (its row mean is 0).
    """
    return per_sequence_mean(values, mask).sum() / max(float(global_valid_sequences), 1.0)


def masked_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Minimum over valid entries; ``+inf`` when there are none (the identity of ``min``)."""
    inf = torch.full((), float("inf"), dtype=values.dtype, device=values.device)
    return torch.where(mask.bool(), values, inf).amin()


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Maximum over valid entries; ``-inf`` when there are none (the identity of ``max``)."""
    ninf = torch.full((), float("-inf"), dtype=values.dtype, device=values.device)
    return torch.where(mask.bool(), values, ninf).amax()


def finite_or_zero(values: torch.Tensor) -> torch.Tensor:
    """Non-finite entries (NaN, ±inf) become 0: an unusable weight drops its token."""
    return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
