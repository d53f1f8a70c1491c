"""Reward transforms and sample filters, with hand-computed values."""

from __future__ import annotations

import pytest
import torch
from algo_helpers import assert_values, t

from dockyard.algorithms.rewards import (
    dynamic_sampling_filter,
    overlong_filter,
    prepare_rewards,
    scale_rewards,
    shape_rewards,
)
from dockyard.config.sections.grpo import GRPOConfig, RewardScalingConfig, RewardShapingConfig


def test_scaling_clamps_then_maps_linearly():
    # source [0, 10] → target [-1, 1]: -5 → clamp 0 → -1; 5 → 0; 12 → clamp 10 → 1; 2.5 → -0.5
    cfg = RewardScalingConfig(enabled=True, source_max=10, target_min=-1, target_max=1)
    assert_values(scale_rewards(t([-5, 5, 12, 2.5]), cfg), [-1, 0, 1, -0.5])
    assert_values(scale_rewards(t([-5.0]), RewardScalingConfig()), [-5.0])  # disabled


def test_overlong_buffer_penalty_is_linear_inside_the_buffer():
    # max 100, buffer 20 → expected 80, penalty 0.5: len 80 → 0; 90 → -10/20·0.5 = -0.25;
    # 100 → -0.5; 150 → bounded at -0.5; 10 → 0
    cfg = RewardShapingConfig(
        enabled=True,
        overlong_buffer_length=20,
        overlong_buffer_penalty=0.5,
        max_response_length=100,
    )
    shaped = shape_rewards(
        torch.ones(5, dtype=torch.float64), cfg, response_lengths=t([80, 90, 100, 150, 10])
    )
    assert_values(shaped, [1.0, 0.75, 0.5, 0.5, 1.0])


def test_stop_properly_penalty_scales_truncated_rewards():
    cfg = RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.25)
    shaped = shape_rewards(t([1.0, 1.0, -2.0]), cfg, truncated=torch.tensor([True, False, True]))
    assert_values(shaped, [0.25, 1.0, -0.5])
    with pytest.raises(ValueError, match="truncated"):
        shape_rewards(t([1.0]), cfg)


def test_prepare_rewards_order_scale_shape_then_invalid_action():
    # scale [0, 2] → [0, 1]: [2, 2, 1] → [1, 1, 0.5]; sample 1 truncated ×0.5 → 0.5;
    # sample 2 invalid → exactly -1
    grpo = GRPOConfig(
        reward_scaling={"enabled": True, "source_max": 2.0},
        reward_shaping={"enabled": True, "stop_properly_penalty_coef": 0.5},
        invalid_action_penalty=-1.0,
    )
    rewards = prepare_rewards(
        t([2, 2, 1]),
        grpo,
        truncated=torch.tensor([False, True, False]),
        invalid_action=torch.tensor([False, False, True]),
    )
    assert_values(rewards, [1.0, 0.5, -1.0])


def test_dynamic_sampling_drops_zero_variance_groups():
    # group a varies (kept), b all 1 (dropped), c varies only through an invalid sample (dropped)
    result = dynamic_sampling_filter(
        t([1, 0, 1, 1, 0, 0, 5]),
        ["a", "a", "b", "b", "c", "c", "c"],
        valid_mask=torch.tensor([1, 1, 1, 1, 1, 1, 0]),
    )
    assert result.keep.tolist() == [True, True, False, False, False, False, False]
    assert (result.num_groups, result.num_groups_kept) == (3, 1)


def test_overlong_filter_masks_truncated_samples():
    assert_values(overlong_filter(t([1, 1, 0]), torch.tensor([True, False, False])), [0, 1, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", [0.7, 0.1, 1.0 / 3.0, 0.3])
def test_dynamic_sampling_drops_equal_float_groups_whatever_the_value(dtype, value):
    # sixteen equal rewards are zero variance even where their float mean rounds (0.7 in
    # float32 used to leave std ≈ 1e-8 and the group was kept); one differing reward is variance
    rewards = torch.tensor([value] * 16 + [value] * 15 + [value + 0.5], dtype=dtype)
    result = dynamic_sampling_filter(rewards, ["flat"] * 16 + ["varied"] * 16)
    assert result.keep.tolist() == [False] * 16 + [True] * 16
    assert (result.num_groups, result.num_groups_kept) == (2, 1)
