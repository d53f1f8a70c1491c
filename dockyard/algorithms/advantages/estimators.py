"""The built-in estimators: ``grpo``, ``reinforce_plus_plus``, ``gdpo``, ``opd``.

Each is one registered class binding its settings to a function of :mod:`.ops`. torch and the
ops are imported inside ``compute`` so that importing this module (to list the names during
config validation) stays free of torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dockyard.algorithms.advantages.registry import (
    AdvantageEstimator,
    AdvantageInputs,
    register_estimator,
)

if TYPE_CHECKING:
    import torch


def _prepare(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(rewards, dense group index, number of groups, valid mask as bool) for one batch."""
    import torch

    from dockyard.algorithms.advantages.ops import group_index, require_finite

    rewards = inputs.rewards.detach()
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    batch = rewards.shape[0]
    if rewards.dim() != 1 or inputs.token_mask.dim() != 2 or inputs.token_mask.shape[0] != batch:
        raise ValueError(
            f"rewards must be [B] and token_mask [B, T]; got {tuple(rewards.shape)} and "
            f"{tuple(inputs.token_mask.shape)}"
        )
    valid = (
        torch.ones(batch, dtype=torch.bool, device=rewards.device)
        if inputs.valid_mask is None
        else inputs.valid_mask.bool()
    )
    index, num_groups = group_index(inputs.group_ids, rewards.device)
    if index.shape[0] != batch or valid.shape[0] != batch:
        raise ValueError(
            f"group_ids ({index.shape[0]}) and valid_mask ({valid.shape[0]}) must have one "
            f"entry per reward ({batch})"
        )
    require_finite("rewards", rewards, valid)
    return rewards, index, num_groups, valid


def _per_token(per_sample: torch.Tensor, inputs: AdvantageInputs) -> torch.Tensor:
    from dockyard.algorithms.masked import zero_where_masked

    expanded = per_sample.unsqueeze(-1).expand(inputs.token_mask.shape)
    return zero_where_masked(expanded, inputs.token_mask)


@register_estimator
class GRPOEstimator(AdvantageEstimator):
    """``A = r − b`` with the leave-one-out baseline ``b_i = Σ_{j≠i} r_j / (n−1)`` (or the group
    mean), optionally divided by the group std; broadcast over the response tokens."""

    name = "grpo"

    def compute(self, inputs: AdvantageInputs) -> torch.Tensor:
        from dockyard.algorithms.advantages.ops import group_relative_advantages

        rewards, index, num_groups, valid = _prepare(inputs)
        per_sample = group_relative_advantages(
            rewards,
            index,
            num_groups,
            valid,
            leave_one_out=self.settings.use_leave_one_out_baseline,
            normalize=self.settings.normalize_rewards,
        )
        return _per_token(per_sample, inputs)


@register_estimator
class ReinforcePlusPlusEstimator(AdvantageEstimator):
    """REINFORCE++: group-mean baseline (``minus_baseline``), minus the KL-penalised return to go
    ``β·Σ_{i≥t} KL_i`` when ``loss_fn.use_kl_in_reward``, then whitened across the batch's valid
    tokens."""

    name = "reinforce_plus_plus"
    folds_kl_in_reward = True

    def compute(self, inputs: AdvantageInputs) -> torch.Tensor:
        from dockyard.algorithms.advantages.ops import reinforce_plus_plus_advantages
        from dockyard.algorithms.kl import reference_kl
        from dockyard.algorithms.masked import zero_where_masked

        rewards, index, num_groups, valid = _prepare(inputs)
        loss_cfg = self.settings.loss
        penalty = None
        if loss_cfg.use_kl_in_reward:
            if inputs.prev_logprobs is None or inputs.reference_logprobs is None:
                raise ValueError(
                    "loss_fn.use_kl_in_reward needs prev_logprobs and reference_logprobs"
                )
            kl = reference_kl(inputs.prev_logprobs.detach(), inputs.reference_logprobs, loss_cfg)
            penalty = zero_where_masked(
                loss_cfg.reference_policy_kl_penalty * kl, inputs.token_mask
            )
        return reinforce_plus_plus_advantages(
            rewards,
            index,
            num_groups,
            valid,
            inputs.token_mask,
            minus_baseline=self.settings.minus_baseline,
            kl_penalty_per_token=penalty,
        )


@register_estimator
class GDPOEstimator(AdvantageEstimator):
    """GDPO: each named reward component normalised within its group, weighted by
    ``grpo.adv_estimator.reward_weights`` (equal when unset), summed, renormalised."""

    name = "gdpo"

    def compute(self, inputs: AdvantageInputs) -> torch.Tensor:
        from dockyard.algorithms.advantages.ops import gdpo_advantages, require_finite

        _, index, num_groups, valid = _prepare(inputs)
        components = dict(inputs.reward_components or {})
        for name, values in components.items():
            if tuple(values.shape) != tuple(valid.shape):
                raise ValueError(
                    f"reward component {name!r} must be [B], got {tuple(values.shape)}"
                )
            require_finite(f"reward component {name!r}", values, valid)
        per_sample = gdpo_advantages(
            components,
            self.settings.reward_weights,
            index,
            num_groups,
            valid,
            leave_one_out=self.settings.use_leave_one_out_baseline,
            normalize=self.settings.normalize_rewards,
        )
        return _per_token(per_sample, inputs)


@register_estimator
class OPDEstimator(AdvantageEstimator):
    """On-policy distillation: ``Â_t = sg[log π_teacher(t) − prev(t)]``; the reward is unused."""

    name = "opd"

    def compute(self, inputs: AdvantageInputs) -> torch.Tensor:
        import torch

        from dockyard.algorithms.advantages.ops import opd_advantages, require_finite

        if inputs.teacher_logprobs is None or inputs.prev_logprobs is None:
            raise ValueError("the opd estimator needs teacher_logprobs and prev_logprobs")
        mask = inputs.token_mask.bool()
        valid = (
            torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
            if inputs.valid_mask is None
            else inputs.valid_mask.bool()
        )
        used = mask & valid.unsqueeze(-1)
        require_finite("teacher_logprobs", inputs.teacher_logprobs, used)
        require_finite("prev_logprobs", inputs.prev_logprobs, used)
        return opd_advantages(inputs.teacher_logprobs, inputs.prev_logprobs, mask, valid)
