"""Reward transforms of the GRPO loop, applied per sample ``[B]`` before advantages.

:func:`prepare_rewards` applies them in this order, each only when configured:

1. scaling (``grpo.reward_scaling``): clamp to ``[source_min, source_max]``, then map linearly
   onto ``[target_min, target_max]`` — it normalises the environment's raw scale, so it runs
   first and the penalties below are in the target scale;
2. shaping (``grpo.reward_shaping``): the stop-properly penalty scales the reward of truncated
   responses by ``stop_properly_penalty_coef``; the DAPO overlong-buffer penalty subtracts
   ``overlong_buffer_penalty · (len − (max_response_length − overlong_buffer_length)) /
   overlong_buffer_length``, bounded to ``[−overlong_buffer_penalty, 0]``;
3. invalid actions (``grpo.invalid_action_penalty``): a flagged sample's reward is *set* to it.

Plus the sample filters of the sync loop: dynamic sampling (drop groups whose rewards do not
vary: they carry no GRPO signal) and overlong filtering (mask truncated responses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dockyard.algorithms.advantages.ops import group_index, group_stats
from dockyard.config.sections.grpo import GRPOConfig, RewardScalingConfig, RewardShapingConfig


def scale_rewards(rewards: torch.Tensor, cfg: RewardScalingConfig) -> torch.Tensor:
    if not cfg.enabled:
        return rewards
    clamped = rewards.clamp(min=cfg.source_min, max=cfg.source_max)
    unit = (clamped - cfg.source_min) / (cfg.source_max - cfg.source_min)
    return cfg.target_min + unit * (cfg.target_max - cfg.target_min)


def shape_rewards(
    rewards: torch.Tensor,
    cfg: RewardShapingConfig,
    *,
    response_lengths: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
) -> torch.Tensor:
    """Length-based shaping. ``response_lengths``: generated tokens per sample; ``truncated``:
    the response hit the length limit without stopping (no EOS / stop string)."""
    if not cfg.enabled:
        return rewards
    if cfg.stop_properly_penalty_coef is not None:
        if truncated is None:
            raise ValueError("grpo.reward_shaping.stop_properly_penalty_coef needs `truncated`")
        rewards = torch.where(truncated.bool(), rewards * cfg.stop_properly_penalty_coef, rewards)
    if cfg.overlong_buffer_length > 0:
        if response_lengths is None:
            raise ValueError("grpo.reward_shaping.overlong_buffer_length needs response_lengths")
        assert cfg.max_response_length is not None  # RewardShapingConfig.rule_issues
        expected = cfg.max_response_length - cfg.overlong_buffer_length
        exceed = response_lengths.to(rewards.dtype) - expected
        penalty = (-exceed / cfg.overlong_buffer_length * cfg.overlong_buffer_penalty).clamp(
            min=-cfg.overlong_buffer_penalty, max=0.0
        )
        rewards = rewards + penalty
    return rewards


def apply_invalid_action_penalty(
    rewards: torch.Tensor, invalid_action: torch.Tensor | None, penalty: float | None
) -> torch.Tensor:
    """``grpo.invalid_action_penalty``: flagged samples get exactly this reward."""
    if invalid_action is None or penalty is None:
        return rewards
    return torch.where(invalid_action.bool(), torch.full_like(rewards, penalty), rewards)


def prepare_rewards(
    rewards: torch.Tensor,
    grpo: GRPOConfig,
    *,
    response_lengths: torch.Tensor | None = None,
    truncated: torch.Tensor | None = None,
    invalid_action: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaling → shaping → invalid-action penalty (see the module docstring)."""
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))
    rewards = scale_rewards(rewards, grpo.reward_scaling)
    rewards = shape_rewards(
        rewards, grpo.reward_shaping, response_lengths=response_lengths, truncated=truncated
    )
    return apply_invalid_action_penalty(rewards, invalid_action, grpo.invalid_action_penalty)


@dataclass(frozen=True)
class DynamicSamplingResult:
    keep: torch.Tensor  # [B] bool: the sample's group has reward variance
    num_groups: int
    num_groups_kept: int


def dynamic_sampling_filter(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Sequence[int] | Sequence[str],
    valid_mask: torch.Tensor | None = None,
) -> DynamicSamplingResult:
    """``grpo.use_dynamic_sampling`` (DAPO): keep only groups whose valid rewards are not all
    equal. A zero-variance group has zero advantage everywhere, so training on it only dilutes
    the batch; the sync loop refills from further generation batches (at most
    ``grpo.dynamic_sampling_max_gen_batches``)."""
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))
    index, num_groups = group_index(group_ids, rewards.device)
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid_mask is None else valid_mask.bool()
    keep = group_stats(rewards, index, num_groups, valid).varied
    kept_groups = torch.zeros(num_groups, dtype=torch.bool, device=rewards.device)
    kept_groups[index[keep]] = True
    return DynamicSamplingResult(
        keep=keep, num_groups=num_groups, num_groups_kept=int(kept_groups.sum())
    )


def overlong_filter(sample_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """``grpo.overlong_filtering``: truncated responses leave the loss (their sample mask → 0)."""
    return sample_mask * (~truncated.bool()).to(sample_mask.dtype)
