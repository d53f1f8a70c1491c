"""Ratios of probabilities from log-ratios, with the log-ratio bounded before ``exp``.

``exp`` of a float32 log-ratio above ≈ 88.7 is ``inf``. The loss then survives in value (a
clipped token takes the other side of the ``max``), but backward through ``exp`` multiplies a
zero upstream gradient by ``inf`` and one token makes the whole step's gradient NaN. Every ratio
and importance weight is therefore ``exp(clamp(log_ratio, ±LOG_RATIO_BOUND))`` (verl clamps the
PPO log-ratio to ±20 the same way): inside the bound values and gradients are the plain ``exp``'s;
outside, the ratio is ``e^±20`` and its gradient 0 — far past any clip range, where no useful
gradient exists anyway.
"""

from __future__ import annotations

import torch

#: |log-ratio| above which a ratio is held at ``e^±20`` (≈ 4.9e8; finite in float32 and bf16).
LOG_RATIO_BOUND = 20.0


def bounded_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(clamp(log_ratio, −20, 20))``: finite, with the plain gradient inside the bound.

    NaN stays NaN (a NaN log-prob is an error for the caller to see, not a ratio to bound)."""
    return torch.exp(log_ratio.clamp(min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND))


def bounded_weight(log_ratio: torch.Tensor) -> torch.Tensor:
    """An importance weight from its log-ratio: :func:`bounded_exp`, and 0 where the log-ratio is
    not finite (a token the engine gave probability zero, or NaN): such a weight is no weight at
    all, and the token is dropped rather than held at the bound."""
    finite = torch.isfinite(log_ratio)
    safe = torch.where(finite, log_ratio, torch.zeros_like(log_ratio))
    return torch.where(finite, bounded_exp(safe), torch.zeros_like(log_ratio))
