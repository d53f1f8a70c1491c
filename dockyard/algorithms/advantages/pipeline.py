"""The advantage stage of one GRPO step: estimate, fold KL in, clip, override flagged samples."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.algorithms.advantages.registry import AdvantageEstimator, AdvantageInputs
from dockyard.algorithms.kl import fold_kl_into_advantages
from dockyard.algorithms.masked import zero_where_masked
from dockyard.config.sections.grpo import GRPOConfig
from dockyard.config.sections.loss import ClippedPGLossConfig


@dataclass(frozen=True)
class AdvantageOverrides:
    """Per-sample flags ``[B]`` (bool) from the environment / output parser.

    A flagged sample's advantage is *set* to ``grpo.invalid_tool_call_advantage`` or
    ``grpo.malformed_thinking_advantage`` on all its tokens (when that value is configured), after
    clipping, so the configured value is exactly what trains. Malformed thinking wins when both
    flags are set (the output is broken before any tool call could be judged).
    """

    invalid_tool_call: torch.Tensor | None = None
    malformed_thinking: torch.Tensor | None = None


def clip_advantages(
    advantages: torch.Tensor, low: float | None, high: float | None
) -> torch.Tensor:
    """``grpo.advantage_clip_low/high``; ``None`` leaves that side open."""
    if low is None and high is None:
        return advantages
    return advantages.clamp(min=low, max=high)


def override_advantages(
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    overrides: AdvantageOverrides,
    grpo: GRPOConfig,
) -> torch.Tensor:
    ordered = (
        (overrides.invalid_tool_call, grpo.invalid_tool_call_advantage),
        (overrides.malformed_thinking, grpo.malformed_thinking_advantage),
    )
    for flags, value in ordered:
        if flags is None or value is None:
            continue
        selected = flags.bool().unsqueeze(-1) & token_mask.bool()
        advantages = torch.where(selected, torch.full_like(advantages, value), advantages)
    return advantages


def compute_advantages(
    estimator: AdvantageEstimator,
    inputs: AdvantageInputs,
    grpo: GRPOConfig,
    loss: ClippedPGLossConfig,
    overrides: AdvantageOverrides | None = None,
) -> torch.Tensor:
    """``[B, T]`` advantages for the full batch of a step, ready for :class:`LossInputs`.

    Order: estimator → ``−β·KL_t`` per token when ``loss_fn.use_kl_in_reward`` (unless the
    estimator folds it itself, as REINFORCE++ does — the return to go ``−β·Σ_{i≥t} KL_i``,
    before whitening; KL of π_old, no gradient)
    → clip to ``[advantage_clip_low, advantage_clip_high]`` → invalid-output overrides.
    """
    advantages = estimator.compute(inputs)
    if loss.use_kl_in_reward and not estimator.folds_kl_in_reward:
        if inputs.prev_logprobs is None or inputs.reference_logprobs is None:
            raise ValueError("loss_fn.use_kl_in_reward needs prev_logprobs and reference_logprobs")
        advantages = fold_kl_into_advantages(
            advantages, inputs.prev_logprobs, inputs.reference_logprobs, inputs.token_mask, loss
        )
    advantages = clip_advantages(advantages, grpo.advantage_clip_low, grpo.advantage_clip_high)
    if overrides is not None:
        advantages = override_advantages(advantages, inputs.token_mask, overrides, grpo)
    if inputs.valid_mask is not None:
        advantages = zero_where_masked(advantages, inputs.valid_mask.bool().unsqueeze(-1))
    return zero_where_masked(advantages, inputs.token_mask)
