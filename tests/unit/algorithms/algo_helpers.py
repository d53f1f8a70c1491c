"""Helpers for the algorithm tests: small float64 batches written out by hand.

(A plainly named module rather than a conftest, so tests import it explicitly.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts, LossInputs
from dockyard.algorithms.loss_metrics import LossMetrics
from dockyard.config.sections.loss import ClippedPGLossConfig

Rows = Sequence[Sequence[float]]


def t(rows: Rows | Sequence[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def logs(rows: Rows) -> torch.Tensor:
    """log of each entry: lets a test state ratios and weights directly."""
    return torch.tensor([[math.log(x) for x in row] for row in rows], dtype=torch.float64)


def assert_values(actual: torch.Tensor, expected: Rows | Sequence[float]) -> None:
    torch.testing.assert_close(actual, t(expected).to(actual.dtype))


class LossCase:
    """Build LossInputs from plain lists, run the loss, keep the gradient of ``logprobs``."""

    def __init__(
        self,
        logprobs: torch.Tensor,
        advantages: torch.Tensor,
        *,
        prev: torch.Tensor | None = None,
        gen: torch.Tensor | None = None,
        ref: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        sample_mask: torch.Tensor | None = None,
        rewards: torch.Tensor | None = None,
    ) -> None:
        self.logprobs = logprobs.clone().requires_grad_(True)
        zeros = torch.zeros_like(logprobs)
        self.inputs = LossInputs(
            logprobs=self.logprobs,
            prev_logprobs=zeros if prev is None else prev,
            generation_logprobs=(zeros if prev is None else prev) if gen is None else gen,
            advantages=advantages,
            token_mask=torch.ones_like(logprobs) if token_mask is None else token_mask,
            sample_mask=torch.ones(logprobs.shape[0]) if sample_mask is None else sample_mask,
            reference_logprobs=ref,
            rewards=rewards,
        )

    def run(self, **cfg: object) -> tuple[float, LossMetrics, torch.Tensor]:
        cfg.setdefault("reference_policy_kl_penalty", 0.0)
        loss_fn = ClippedPGLoss(ClippedPGLossConfig(**cfg))
        counts = GlobalCounts.from_batch(
            self.inputs.token_mask, self.inputs.sample_mask, self.inputs.rewards
        )
        loss, metrics = loss_fn(self.inputs, counts)
        loss.backward()
        assert self.logprobs.grad is not None
        return loss.item(), metrics, self.logprobs.grad.clone()
