"""Advantage estimators against hand-computed values; registry and pipeline behaviour."""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import assert_values, t

from dockyard.algorithms.advantages import (
    AdvantageEstimator,
    AdvantageInputs,
    AdvantageOverrides,
    build_estimator,
    compute_advantages,
    estimator_names,
    register_estimator,
    registry,
)
from dockyard.config.sections.grpo import GRPOConfig
from dockyard.config.sections.loss import ClippedPGLossConfig

EPS = 1e-6
LOSS = ClippedPGLossConfig(reference_policy_kl_penalty=0.0)


def grpo_cfg(name: str = "grpo", **adv: object) -> GRPOConfig:
    return GRPOConfig(adv_estimator={"name": name, **adv})


def inputs(rewards, group_ids, length: int = 2, **extra) -> AdvantageInputs:
    return AdvantageInputs(
        rewards=t(rewards),
        group_ids=group_ids,
        token_mask=torch.ones(len(rewards), length),
        **extra,
    )


def first_token(advantages: torch.Tensor) -> list[float]:
    return advantages[:, 0].tolist()


def test_registry_names_and_one_class_extension(monkeypatch):
    # a private copy of the registry, so the test class does not leak into other tests
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert estimator_names()[:4] == ["grpo", "reinforce_plus_plus", "gdpo", "opd"]

    @register_estimator
    class ConstantEstimator(AdvantageEstimator):
        name = "test_constant"

        def compute(self, inputs: AdvantageInputs) -> torch.Tensor:
            return torch.ones_like(inputs.token_mask, dtype=torch.float64)

    assert "test_constant" in estimator_names()
    estimator = build_estimator(grpo_cfg("test_constant"), LOSS)
    assert isinstance(estimator, ConstantEstimator)
    with pytest.raises(ValueError, match=r"grpo\.adv_estimator\.name"):
        build_estimator(grpo_cfg("nope"), LOSS)


def test_grpo_leave_one_out_without_normalisation():
    # group a: r = [1, 0, 0]: b_0 = (0+0)/2 = 0 → 1; b_1 = (1+0)/2 = 0.5 → -0.5; same for r_2
    # group b: r = [2, 4]:   b = 4 → -2; b = 2 → 2
    est = build_estimator(grpo_cfg(normalize_rewards=False), LOSS)
    adv = est.compute(inputs([1, 0, 0, 2, 4], ["a", "a", "a", "b", "b"]))
    assert first_token(adv) == pytest.approx([1.0, -0.5, -0.5, -2.0, 2.0])


def test_grpo_normalises_by_group_std_only_where_positive():
    # group 0: r = [1, 0, 0], mean 1/3, Bessel var = ((2/3)² + 2(1/3)²)/2 = 1/3, std = 1/√3
    #          LOO advantages [1, -0.5, -0.5] / (1/√3 + 1e-6)
    # group 1: r = [5, 5]: std 0 → advantages stay r - b = 0
    est = build_estimator(grpo_cfg(), LOSS)
    adv = est.compute(inputs([1, 0, 0, 5, 5], torch.tensor([0, 0, 0, 1, 1])))
    std = 1 / math.sqrt(3)
    expected = [1 / (std + EPS), -0.5 / (std + EPS), -0.5 / (std + EPS), 0.0, 0.0]
    assert first_token(adv) == pytest.approx(expected)


def test_grpo_group_mean_baseline_option():
    # use_leave_one_out_baseline=false: b = mean = 1/3 → [2/3, -1/3, -1/3]
    est = build_estimator(grpo_cfg(normalize_rewards=False, use_leave_one_out_baseline=False), LOSS)
    assert first_token(est.compute(inputs([1, 0, 0], [7, 7, 7]))) == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3]
    )


def test_groups_are_ids_not_prompts_and_small_groups_get_zero():
    # rows 0-1 and 2-3 could share a prompt; their ids differ, so they are separate groups.
    # row 4 is alone in its group (≤ 1 valid sample → 0); row 5 is invalid (→ 0, and it does
    # not vote: group "c" then has one valid sample → 0 for row 6 too).
    est = build_estimator(grpo_cfg(normalize_rewards=False), LOSS)
    adv = est.compute(
        inputs(
            [1, 0, 3, 1, 9, 100, 4],
            ["a", "a", "b", "b", "solo", "c", "c"],
            valid_mask=t([1, 1, 1, 1, 1, 0, 1]),
        )
    )
    assert first_token(adv) == pytest.approx([1.0, -1.0, 2.0, -2.0, 0.0, 0.0, 0.0])


def test_advantages_are_zero_on_masked_tokens():
    est = build_estimator(grpo_cfg(normalize_rewards=False), LOSS)
    batch = AdvantageInputs(rewards=t([1, 0]), group_ids=[0, 0], token_mask=t([[1, 1], [1, 0]]))
    assert_values(est.compute(batch), [[1.0, 1.0], [-1.0, 0.0]])


def test_reinforce_plus_plus_centres_then_whitens_over_tokens():
    # group mean 0.5 → [0.5, -0.5] per sample; token mask rows [1,1] and [1,0]:
    # valid tokens 0.5, 0.5, -0.5 → mean 1/6, population var = (2·(1/3)² + (2/3)²)/3 = 2/9
    est = build_estimator(grpo_cfg("reinforce_plus_plus"), LOSS)
    batch = AdvantageInputs(rewards=t([1, 0]), group_ids=[0, 0], token_mask=t([[1, 1], [1, 0]]))
    a, b = (0.5 - 1 / 6) / math.sqrt(2 / 9), (-0.5 - 1 / 6) / math.sqrt(2 / 9)
    assert_values(est.compute(batch), [[a, a], [b, 0.0]])


def test_reinforce_plus_plus_folds_kl_in_before_whitening():
    # β = 0.5, k1, prev − ref = [[1, 0], [0, 0]] → penalty 0.5 on token (0, 0)
    # pre-whitening: [[0.5 - 0.5, 0.5], [-0.5, -0.5]] = [[0, .5], [-.5, -.5]]; mean -1/8,
    # population var = ((1/8)² + (5/8)² + 2·(3/8)²)/4 = 0.171875
    loss = ClippedPGLossConfig(
        reference_policy_kl_penalty=0.5, reference_policy_kl_type="k1", use_kl_in_reward=True
    )
    est = build_estimator(grpo_cfg("reinforce_plus_plus"), loss)
    batch = AdvantageInputs(
        rewards=t([1, 0]),
        group_ids=[0, 0],
        token_mask=torch.ones(2, 2),
        prev_logprobs=t([[1.0, 0.0], [0.0, 0.0]]),
        reference_logprobs=torch.zeros(2, 2, dtype=torch.float64),
    )
    s = math.sqrt(0.171875)
    expected = [[(0 + 1 / 8) / s, (0.5 + 1 / 8) / s], [(-0.5 + 1 / 8) / s] * 2]
    assert_values(est.compute(batch), expected)


def _reinforce_plus_plus_by_definition(
    rewards: list[float],
    groups: list[int],
    mask: list[list[float]],
    kl: list[list[float]],
    beta: float,
    minus_baseline: bool,
) -> list[list[float]]:
    """REINFORCE++ (arXiv 2501.03262; verl's compute_reinforce_plus_plus_outcome_advantage,
    γ = 1) written out with loops: the KL-penalised return to go over the sample's valid tokens,
    A_t = (r − b) − β·Σ_{i ≥ t, valid} KL_i, then whitened over every valid token of the batch
    with the population variance."""
    returns: list[list[float]] = []
    for row, reward in enumerate(rewards):
        same = [rewards[j] for j in range(len(rewards)) if groups[j] == groups[row]]
        outcome = reward - sum(same) / len(same) if minus_baseline else reward
        returns.append(
            [
                outcome - beta * sum(kl[row][i] for i in range(t, len(kl[row])) if mask[row][i])
                if mask[row][t]
                else 0.0
                for t in range(len(kl[row]))
            ]
        )
    valid = [
        x for r, m in zip(returns, mask, strict=True) for x, on in zip(r, m, strict=True) if on
    ]
    mean = sum(valid) / len(valid)
    std = math.sqrt(sum((x - mean) ** 2 for x in valid) / len(valid))
    return [
        [(x - mean) / std if on else 0.0 for x, on in zip(r, m, strict=True)]
        for r, m in zip(returns, mask, strict=True)
    ]


def _kl_in_reward_estimator(beta: float, minus_baseline: bool) -> AdvantageEstimator:
    loss = ClippedPGLossConfig(
        reference_policy_kl_penalty=beta, reference_policy_kl_type="k1", use_kl_in_reward=True
    )
    return build_estimator(grpo_cfg("reinforce_plus_plus", minus_baseline=minus_baseline), loss)


@pytest.mark.parametrize(
    ("minus_baseline", "expected"),
    [
        # r − β·Σ_{i≥t} KL_i: [[1 − 0.2, 1 − 0.2], [0, 0]] = [[0.8, 0.8], [0, 0]];
        # mean 0.4, population std 0.4 → [[1, 1], [−1, −1]] (issue 44's minimal case).
        (False, [[1.0, 1.0], [-1.0, -1.0]]),
        # One sample per group: r − mean_group(r) = 0, so A = −β·Σ KL = [[−0.2, −0.2], [0, 0]];
        # mean −0.1, std 0.1 → [[−1, −1], [1, 1]].
        (True, [[-1.0, -1.0], [1.0, 1.0]]),
    ],
)
def test_reinforce_plus_plus_penalises_the_kl_return_to_go(minus_baseline, expected):
    # prev −1 everywhere, reference [[−1, −1.2], [−1, −1]], k1 = prev − ref: KL only on the
    # last token of sample 0 (0.2). Every token of sample 0 carries the KL still to come.
    batch = AdvantageInputs(
        rewards=t([1, 0]),
        group_ids=[0, 1],
        token_mask=torch.ones(2, 2),
        prev_logprobs=torch.full((2, 2), -1.0, dtype=torch.float64),
        reference_logprobs=t([[-1.0, -1.2], [-1.0, -1.0]]),
    )
    got = _kl_in_reward_estimator(1.0, minus_baseline).compute(batch)
    assert_values(got, expected)


@pytest.mark.parametrize("minus_baseline", [False, True])
def test_reinforce_plus_plus_return_to_go_counts_only_valid_tokens(minus_baseline):
    # A masked token in the middle (an observation of a multi-turn episode) holds a large KL
    # that must not enter any return; two groups of two, β = 0.5.
    rewards, groups = [1.0, 0.0, 0.5, 1.0], [0, 0, 1, 1]
    mask = [[1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 1, 1]]
    prev = [[-1.0, -1.0, -1.0], [-2.0, -1.0, -0.5], [-1.0, -3.0, -1.0], [-1.0, -1.0, -2.0]]
    ref = [[-1.1, -6.0, -1.3], [-2.0, -1.2, -0.5], [-1.4, -3.0, -9.0], [-7.0, -1.5, -2.1]]
    kl = [[p - r for p, r in zip(pr, rr, strict=True)] for pr, rr in zip(prev, ref, strict=True)]
    batch = AdvantageInputs(
        rewards=t(rewards),
        group_ids=groups,
        token_mask=t(mask),
        prev_logprobs=t(prev),
        reference_logprobs=t(ref),
    )
    got = _kl_in_reward_estimator(0.5, minus_baseline).compute(batch)
    assert_values(
        got, _reinforce_plus_plus_by_definition(rewards, groups, mask, kl, 0.5, minus_baseline)
    )


def test_gdpo_normalises_each_component_then_the_sum():
    # two groups of two, components "correct" and "format"; LOO, no per-group std:
    # correct [1, 0 | 1, 1] → [1, -1 | 0, 0]; format [1, 0 | 0, 1] → [1, -1 | -1, 1]
    # weights correct 2, format 1: [3, -3, -1, 1]; mean 0, Bessel std = √(20/3)
    est = build_estimator(
        grpo_cfg("gdpo", normalize_rewards=False, reward_weights={"correct": 2.0, "format": 1.0}),
        LOSS,
    )
    batch = inputs(
        [0, 0, 0, 0],
        [0, 0, 1, 1],
        reward_components={"correct": t([1, 0, 1, 1]), "format": t([1, 0, 0, 1])},
    )
    std = math.sqrt(20 / 3)
    assert first_token(est.compute(batch)) == pytest.approx([3 / std, -3 / std, -1 / std, 1 / std])


def test_gdpo_refuses_a_single_component_and_mismatched_weights():
    est = build_estimator(grpo_cfg("gdpo"), LOSS)
    with pytest.raises(ValueError, match="two named reward components"):
        est.compute(inputs([0, 0], [0, 0], reward_components={"only": t([1, 0])}))
    weighted = build_estimator(grpo_cfg("gdpo", reward_weights={"a": 1.0}), LOSS)
    with pytest.raises(ValueError, match="reward_weights"):
        weighted.compute(inputs([0, 0], [0, 0], reward_components={"a": t([1, 0]), "b": t([0, 1])}))


def test_opd_is_teacher_minus_prev_and_ignores_reward():
    # Â = teacher − prev on valid tokens:
    # [[-1 - (-2), -3 - (-1)], [-0.5 - (-1), masked]] = [[1, -2], [0.5, 0]]
    est = build_estimator(grpo_cfg("opd"), LOSS)
    batch = AdvantageInputs(
        rewards=t([123.0, -7.0]),
        group_ids=[0, 0],
        token_mask=t([[1, 1], [1, 0]]),
        teacher_logprobs=t([[-1.0, -3.0], [-0.5, -9.0]]),
        prev_logprobs=t([[-2.0, -1.0], [-1.0, -1.0]]),
    )
    assert_values(est.compute(batch), [[1.0, -2.0], [0.5, 0.0]])


def test_non_finite_rewards_are_refused():
    est = build_estimator(grpo_cfg(), LOSS)
    with pytest.raises(ValueError, match="non-finite"):
        est.compute(inputs([1.0, math.nan], [0, 0]))


def test_pipeline_folds_kl_clips_and_overrides():
    # grpo, no normalisation: r = [1, 0] → [1, -1]; KL in reward with β = 1, k1,
    # prev − ref = 0.5 on every token → [0.5, -1.5]; clip to [-1, 0.8] → [0.5, -1];
    # sample 1 flagged malformed → its advantage is set to -0.25
    loss = ClippedPGLossConfig(
        reference_policy_kl_penalty=1.0, reference_policy_kl_type="k1", use_kl_in_reward=True
    )
    grpo = GRPOConfig(
        adv_estimator={"normalize_rewards": False},
        advantage_clip_low=-1.0,
        advantage_clip_high=0.8,
        malformed_thinking_advantage=-0.25,
    )
    batch = AdvantageInputs(
        rewards=t([1, 0]),
        group_ids=[0, 0],
        token_mask=torch.ones(2, 2),
        prev_logprobs=torch.full((2, 2), 0.5, dtype=torch.float64),
        reference_logprobs=torch.zeros(2, 2, dtype=torch.float64),
    )
    estimator = build_estimator(grpo, loss)
    plain = compute_advantages(estimator, batch, grpo, loss)
    assert_values(plain, [[0.5, 0.5], [-1.0, -1.0]])
    flagged = compute_advantages(
        estimator, batch, grpo, loss, AdvantageOverrides(malformed_thinking=t([0, 1]).bool())
    )
    assert_values(flagged, [[0.5, 0.5], [-0.25, -0.25]])


CONSTANT_REWARDS = [0.7, 0.1, 1.0 / 3.0, 1e-3, 123.456, -2.9]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("value", CONSTANT_REWARDS)
@pytest.mark.parametrize("leave_one_out", [True, False])
def test_a_group_of_equal_rewards_has_zero_advantage_exactly(dtype, value, leave_one_out):
    # Sixteen equal rewards: r − b = 0 for every sample, so A = 0 exactly, normalised or not.
    # (float32 0.7 × 16 used to leave a std of ≈1e-8 that counted as variance and became
    # A ≈ +0.106 after dividing by std + 1e-6.) A varied group beside it keeps its advantages.
    rewards = torch.tensor([value] * 16 + [1.0, 0.0], dtype=dtype)
    ids = ["flat"] * 16 + ["varied"] * 2
    for normalize in (True, False):
        est = build_estimator(
            grpo_cfg(normalize_rewards=normalize, use_leave_one_out_baseline=leave_one_out), LOSS
        )
        adv = est.compute(
            AdvantageInputs(rewards=rewards, group_ids=ids, token_mask=torch.ones(18, 2))
        )
        assert torch.count_nonzero(adv[:16]) == 0
        # varied group of two: LOO b = the other reward → ±1; group mean b = 0.5 → ±0.5;
        # normalised by its std 1/√2 (+1e-6)
        raw = 1.0 if leave_one_out else 0.5
        scale = 1.0 / (1.0 / math.sqrt(2.0) + EPS) if normalize else 1.0
        assert first_token(adv[16:].double()) == pytest.approx(
            [raw * scale, -raw * scale], rel=1e-2 if dtype == torch.bfloat16 else 1e-5
        )


def test_gdpo_gives_zero_to_groups_flat_in_every_component():
    # Both groups are flat in both components (float32 values whose mean rounds): every
    # component advantage is 0, the weighted sum is 0, and so is the final normalisation.
    est = build_estimator(grpo_cfg("gdpo"), LOSS)
    n = 16
    batch = AdvantageInputs(
        rewards=torch.zeros(2 * n),
        group_ids=[0] * n + [1] * n,
        token_mask=torch.ones(2 * n, 2),
        reward_components={
            "correct": torch.full((2 * n,), 0.7, dtype=torch.float32),
            "format": torch.tensor([0.1] * n + [0.3] * n, dtype=torch.float32),
        },
    )
    assert torch.count_nonzero(est.compute(batch)) == 0
