"""Per-token KL estimators against the reference policy, and the KL-in-reward fold.

With ``logr = ref − lp`` (clamped to ``±kl_input_clamp_value``) the estimators of
``KL(π_θ ‖ π_ref)`` on tokens sampled from π_θ are (Schulman, "Approximating KL divergence"):

- ``k1 = −logr``                 unbiased, can be negative;
- ``k2 = logr² / 2``             biased, low variance;
- ``k3 = exp(logr) − 1 − logr``  unbiased and non-negative (the GRPO default).

The result is clamped to ``±kl_output_clamp_value``.
"""

from __future__ import annotations

import torch

from dockyard.algorithms.masked import zero_where_masked
from dockyard.config.sections.loss import ClippedPGLossConfig, KLType


def kl_estimate(
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    kl_type: KLType = "k3",
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of ``KL(π ‖ π_ref)`` from the sampled tokens' log-probs."""
    log_ratio = reference_logprobs - logprobs
    if input_clamp is not None:
        log_ratio = log_ratio.clamp(min=-input_clamp, max=input_clamp)
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = log_ratio.square() / 2
    elif kl_type == "k3":
        kl = torch.exp(log_ratio) - 1 - log_ratio
    else:
        raise ValueError(f"unknown KL type {kl_type!r}; choose k1, k2 or k3")
    if output_clamp is not None:
        kl = kl.clamp(min=-output_clamp, max=output_clamp)
    return kl


def reference_kl(
    logprobs: torch.Tensor, reference_logprobs: torch.Tensor, cfg: ClippedPGLossConfig
) -> torch.Tensor:
    """``kl_estimate`` with the type and clamps of ``cfg`` (``loss_fn.*``)."""
    return kl_estimate(
        logprobs,
        reference_logprobs,
        cfg.reference_policy_kl_type,
        cfg.kl_input_clamp_value,
        cfg.kl_output_clamp_value,
    )


def fold_kl_into_advantages(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    cfg: ClippedPGLossConfig,
) -> torch.Tensor:
    """``loss_fn.use_kl_in_reward``: per-token ``A_t − β·KL_t`` instead of a KL term in the loss.

    ``logprobs`` should be π_old (``prev_logprobs``): the penalty is a fixed part of the reward,
    computed once per step, so it carries no gradient (everything here is detached). ``β`` is
    ``loss_fn.reference_policy_kl_penalty``; the KL uses the configured type and clamps. Masked
    tokens keep their advantage untouched (0 in practice, the loss ignores them anyway).
    """
    advantages = advantages.detach()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    kl = reference_kl(logprobs.detach(), reference_logprobs.detach(), cfg)
    penalty = zero_where_masked(cfg.reference_policy_kl_penalty * kl, token_mask)
    return advantages - penalty
