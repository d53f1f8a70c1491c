"""Every branch of ClippedPGLoss against values worked out by hand (arithmetic in comments)."""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import LossCase, assert_values, logs, t

from dockyard.algorithms.kl import kl_estimate

LN2 = math.log(2.0)


def test_ppo_clipped_surrogate_token_level():
    # ratios r = [1.5, 0.9, 0.5] (prev = gen = 0), A = [1, 1, -1], ε = 0.2 → clamp to [0.8, 1.2]
    # t1: max(-1.5, -1.2) = -1.2 (clipped, no gradient)
    # t2: max(-0.9, -0.9) = -0.9 (unclipped, dL/dlp = -A·r = -0.9)
    # t3: max(0.5, 0.8)   =  0.8 (clipped, no gradient)
    case = LossCase(logs([[1.5, 0.9, 0.5]]), t([[1.0, 1.0, -1.0]]))
    loss, m, grad = case.run()
    assert loss == pytest.approx((-1.2 - 0.9 + 0.8) / 3)
    assert_values(grad, [[0.0, -0.9 / 3, 0.0]])
    assert m.ratio_mean == pytest.approx((1.5 + 0.9 + 0.5) / 3)
    assert (m.ratio_min, m.ratio_max) == pytest.approx((0.5, 1.5))
    assert m.ratio_clamped_mean == pytest.approx((1.2 + 0.9 + 0.8) / 3)
    assert m.clip_fraction == pytest.approx(2 / 3)
    assert (m.num_valid_tokens, m.num_valid_samples) == (3.0, 1.0)


def test_asymmetric_clip_uses_separate_low_and_high():
    # ε_low = 0.1, ε_high = 0.3: r = 1.25 with A = 1 stays unclipped (≤ 1.3) → -1.25;
    # r = 0.85 with A = -1 is clipped to 0.9 → max(0.85, 0.9) = 0.9
    loss, m, _ = LossCase(logs([[1.25, 0.85]]), t([[1.0, -1.0]])).run(
        ratio_clip_min=0.1, ratio_clip_max=0.3
    )
    assert loss == pytest.approx((-1.25 + 0.9) / 2)
    assert m.clip_fraction == pytest.approx(1 / 2)


def test_dual_clip_caps_negative_advantages():
    # c = 3. t1: A=-1, r=5: max(5, 1.2) = 5 → min(5, 3) = 3 (dual clip binds)
    #        t2: A=-1, r=2: max(2, 1.2) = 2 → min(2, 3) = 2
    #        t3: A=+1, r=5: max(-5, -1.2) = -1.2 (dual clip only for A < 0)
    loss, m, grad = LossCase(logs([[5.0, 2.0, 5.0]]), t([[-1.0, -1.0, 1.0]])).run(ratio_clip_c=3.0)
    assert loss == pytest.approx((3.0 + 2.0 - 1.2) / 3)
    assert m.dual_clip_fraction == pytest.approx(1 / 3)
    # only t2 keeps a gradient: d(-A·r)/dlp = -A·r = 2, divided by 3 tokens
    assert_values(grad, [[0.0, 2.0 / 3, 0.0]])


def test_disable_ppo_ratio_is_reinforce():
    # L = -A·lp: lp = [-1, -2], A = [2, 1] → [2, 2], mean 2; dL/dlp = -A / 2
    loss, m, grad = LossCase(t([[-1.0, -2.0]]), t([[2.0, 1.0]])).run(disable_ppo_ratio=True)
    assert loss == pytest.approx(2.0)
    assert_values(grad, [[-1.0, -0.5]])
    assert m.clip_fraction == 0.0


def test_cispo_weights_logprob_by_stopped_clamped_ratio():
    # r = [1.5, 0.5] → clamp [1.2, 0.8]; A = 1: L = -sg(r_c)·lp → [-1.2·ln1.5, -0.8·ln0.5]
    # gradient is -r_c per token (r_c carries none), / 2 tokens
    loss, _, grad = LossCase(logs([[1.5, 0.5]]), t([[1.0, 1.0]])).run(use_cispo=True)
    assert loss == pytest.approx((-1.2 * math.log(1.5) - 0.8 * math.log(0.5)) / 2)
    assert_values(grad, [[-1.2 / 2, -0.8 / 2]])


def test_gspo_sequence_ratio_with_sequence_level_loss():
    # row 1: token ratios 1.2 and 1.5 → geometric mean sqrt(1.8) ≈ 1.342 → clamp 1.2; A = 1:
    #        each token max(-1.342, -1.2) = -1.2, sequence mean -1.2
    # row 2: one valid token, ratio 0.7 → clamp 0.8; A = -1: max(0.7, 0.8) = 0.8
    # sequence-level: (-1.2 + 0.8) / 2 sequences
    case = LossCase(
        logs([[1.2, 1.5], [0.7, 1.0]]),
        t([[1.0, 1.0], [-1.0, -1.0]]),
        token_mask=t([[1, 1], [1, 0]]),
    )
    loss, m, _ = case.run(sequence_level_importance_ratios=True, token_level_loss=False)
    assert loss == pytest.approx((-1.2 + 0.8) / 2)
    assert m.ratio_max == pytest.approx(math.sqrt(1.8))
    assert m.ratio_min == pytest.approx(0.7)


def test_sequence_level_reduction_averages_per_sequence_first():
    # disable_ppo_ratio, A = 1: L = -lp. row 1 (2 tokens): mean(1, 3) = 2; row 2 (1 token): 4
    # sequence level: (2 + 4) / 2 = 3; token level would be (1 + 3 + 4) / 3 = 8/3
    lp, adv, mask = t([[-1.0, -3.0], [-4.0, -9.0]]), t([1.0, 1.0]), t([[1, 1], [1, 0]])
    seq, _, grad = LossCase(lp, adv, token_mask=mask).run(
        disable_ppo_ratio=True, token_level_loss=False
    )
    tok, _, _ = LossCase(lp, adv, token_mask=mask).run(disable_ppo_ratio=True)
    assert seq == pytest.approx(3.0)
    assert tok == pytest.approx(8 / 3)
    # d/dlp: row 1 tokens -1/2 each / 2 sequences, row 2 token -1 / 2 sequences
    assert_values(grad, [[-0.25, -0.25], [-0.5, 0.0]])


def test_force_on_policy_ratio_is_one_with_policy_gradient():
    # prev is ignored (π_old := sg(lp)), so r ≡ 1: L = -A per token, dL/dlp = -A·1 / N
    case = LossCase(t([[-1.0, -2.0]]), t([[1.0, -2.0]]), prev=t([[-5.0, 3.0]]))
    loss, m, grad = case.run(force_on_policy_ratio=True)
    assert loss == pytest.approx((-1.0 + 2.0) / 2)
    assert_values(grad, [[-0.5, 1.0]])
    assert (m.ratio_min, m.ratio_max) == (1.0, 1.0)


def test_token_importance_weight_without_truncation():
    # r = 1 (lp = prev = 0), A = 1 → L = -1 per token; w = exp(prev - gen) = [0.5, 3]
    # → (-0.5 - 3) / 2
    case = LossCase(t([[0.0, 0.0]]), t([[1.0, 1.0]]), gen=-logs([[0.5, 3.0]]))
    loss, m, _ = case.run(use_importance_sampling_correction=True)
    assert loss == pytest.approx(-3.5 / 2)
    assert m.is_weight_mean == pytest.approx(1.75)
    assert (m.is_weight_min, m.is_weight_max) == pytest.approx((0.5, 3.0))


def test_tis_clamps_weights_and_reports_stats_before_truncation():
    # w = [0.5, 3] clamped to [0, 2] → [0.5, 2]: loss (-0.5 - 2) / 2; stats still see 3
    case = LossCase(t([[0.0, 0.0]]), t([[1.0, 1.0]]), gen=-logs([[0.5, 3.0]]))
    loss, m, _ = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
    )
    assert loss == pytest.approx(-2.5 / 2)
    assert m.is_weight_max == pytest.approx(3.0)
    assert m.is_weight_mean == pytest.approx(1.75)
    assert m.is_truncated_fraction == pytest.approx(1 / 2)


def test_tis_lower_bound_raises_small_weights():
    # w = [0.1, 1] with bounds [0.5, 2] → [0.5, 1]
    case = LossCase(t([[0.0, 0.0]]), t([[1.0, 1.0]]), gen=-logs([[0.1, 1.0]]))
    loss, m, _ = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.5,
    )
    assert loss == pytest.approx(-1.5 / 2)
    assert m.is_truncated_fraction == pytest.approx(1 / 2)


def test_icepop_zeroes_weights_outside_bounds():
    # w = [0.4, 1.5, 3] with [0.5, 2] → [0, 1.5, 0]: loss -1.5 / 3, 2 of 3 masked
    case = LossCase(t([[0.0, 0.0, 0.0]]), t([[1.0, 1.0, 1.0]]), gen=-logs([[0.4, 1.5, 3.0]]))
    loss, m, _ = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.5,
    )
    assert loss == pytest.approx(-1.5 / 3)
    assert m.is_truncated_fraction == pytest.approx(2 / 3)
    assert m.is_weight_mean == pytest.approx((0.4 + 1.5 + 3.0) / 3)


def test_seq_mask_tis_drops_sequences_by_geometric_mean():
    # row 1: w = [2, 0.5] → geometric mean 1 (kept, keeps raw token weights 2 and 0.5)
    # row 2: w = [2, 2]   → geometric mean 2 (outside [0.999, 1.002]: dropped)
    # A = 1, r = 1: token level (-2 - 0.5 + 0 + 0) / 4; 1 of 2 sequences masked
    case = LossCase(
        torch.zeros(2, 2, dtype=torch.float64), t([1.0, 1.0]), gen=-logs([[2.0, 0.5], [2.0, 2.0]])
    )
    loss, m, _ = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=1.002,
        truncated_importance_sampling_ratio_min=0.999,
    )
    assert loss == pytest.approx(-2.5 / 4)
    assert m.is_truncated_fraction == pytest.approx(1 / 2)
    assert m.is_weight_mean == pytest.approx((2 + 0.5 + 2 + 2) / 4)


def test_sequence_level_importance_weight_is_geometric_mean():
    # GSPO + IS, r = 1, A = 1: per sequence L = -w_i, w_i = geometric mean of token weights
    # row 1: sqrt(2 · 0.5) = 1; row 2: sqrt(4 · 1) = 2 → (-1 - 2) / 2 sequences
    case = LossCase(
        torch.zeros(2, 2, dtype=torch.float64), t([1.0, 1.0]), gen=-logs([[2.0, 0.5], [4.0, 1.0]])
    )
    loss, m, _ = case.run(
        use_importance_sampling_correction=True,
        sequence_level_importance_ratios=True,
        token_level_loss=False,
    )
    assert loss == pytest.approx(-1.5)
    assert m.is_weight_mean == pytest.approx((1 + 2) / 2)  # per sequence
    assert (m.is_weight_min, m.is_weight_max) == pytest.approx((1.0, 2.0))


def test_importance_weights_ignored_when_correction_is_off():
    # w = 3 would triple the loss; with the correction off the loss is -A·r = -1 (stats remain)
    case = LossCase(t([[0.0]]), t([[1.0]]), gen=-logs([[3.0]]))
    loss, m, _ = case.run()
    assert loss == pytest.approx(-1.0)
    assert m.is_weight_mean == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [
        # logr = ref - lp = ln(0.25) - ln(0.5) = -ln 2
        ("k1", LN2),  # -logr
        ("k2", LN2**2 / 2),  # logr² / 2
        ("k3", 0.5 - 1 + LN2),  # exp(logr) - 1 - logr
    ],
)
def test_kl_estimators(kl_type, expected):
    kl = kl_estimate(logs([[0.5]]), logs([[0.25]]), kl_type)
    assert kl.item() == pytest.approx(expected)


def test_kl_input_and_output_clamps():
    # input clamp 0.5: logr = -ln2 → -0.5, k1 = 0.5; output clamp 0.1: k2 = ln2²/2 ≈ 0.24 → 0.1
    assert kl_estimate(logs([[0.5]]), logs([[0.25]]), "k1", input_clamp=0.5).item() == 0.5
    clamped = kl_estimate(logs([[0.5]]), logs([[0.25]]), "k2", output_clamp=0.1).item()
    assert clamped == pytest.approx(0.1)


def test_kl_penalty_in_loss_and_its_gradient():
    # A = 0, β = 0.1, k1: KL = lp - ref = ln 0.5 - ln 0.25 = ln 2 → loss 0.1·ln2 (1 token)
    # dL/dlp = β · d(lp - ref)/dlp = 0.1
    case = LossCase(logs([[0.5]]), t([[0.0]]), prev=logs([[0.5]]), ref=logs([[0.25]]))
    loss, m, grad = case.run(reference_policy_kl_penalty=0.1, reference_policy_kl_type="k1")
    assert loss == pytest.approx(0.1 * LN2)
    assert m.kl == pytest.approx(LN2)
    assert m.kl_loss == pytest.approx(0.1 * LN2)
    assert grad.item() == pytest.approx(0.1)


def test_on_policy_kl_approximation_weights_by_current_over_behaviour():
    # same as above but gen = ln 0.25 so sg(exp(lp - gen)) = 0.5 / 0.25 = 2: loss and grad double
    case = LossCase(
        logs([[0.5]]), t([[0.0]]), prev=logs([[0.5]]), gen=logs([[0.25]]), ref=logs([[0.25]])
    )
    loss, _, grad = case.run(
        reference_policy_kl_penalty=0.1,
        reference_policy_kl_type="k1",
        use_on_policy_kl_approximation=True,
    )
    assert loss == pytest.approx(2 * 0.1 * LN2)
    assert grad.item() == pytest.approx(2 * 0.1)


def test_use_kl_in_reward_keeps_kl_out_of_the_loss():
    case = LossCase(logs([[0.5]]), t([[0.0]]), prev=logs([[0.5]]), ref=logs([[0.25]]))
    loss, m, _ = case.run(
        reference_policy_kl_penalty=0.1, reference_policy_kl_type="k1", use_kl_in_reward=True
    )
    assert loss == 0.0
    assert m.kl_loss == 0.0
    assert m.kl == pytest.approx(LN2)  # still reported


def test_kl_penalty_needs_reference_logprobs():
    with pytest.raises(ValueError, match="reference_logprobs"):
        LossCase(t([[0.0]]), t([[0.0]])).run(reference_policy_kl_penalty=0.1)


@pytest.mark.parametrize("token_level", [True, False])
def test_positive_example_nll(token_level):
    # μ = 0.5, rewards [1, 0]: only row 1 is positive. A = 0, so the loss is μ·NLL.
    # row 1: lp = [-1, -3] → token level: (1 + 3) / 2 positive tokens = 2
    #                       sequence level: mean 2 / 1 positive sequence = 2
    case = LossCase(t([[-1.0, -3.0], [-2.0, -2.0]]), t([0.0, 0.0]), rewards=t([1.0, 0.0]))
    loss, m, grad = case.run(positive_example_nll_weight=0.5, token_level_loss=token_level)
    assert loss == pytest.approx(0.5 * 2.0)
    assert m.nll_loss == pytest.approx(2.0)
    assert_values(grad, [[-0.25, -0.25], [0.0, 0.0]])


def test_diagnostics_token_mult_prob_error_gen_kl_and_entropy():
    # prev = 0, gen = [ln2, -ln2], lp = [ln 0.5, ln 0.5], A = 0
    # token_mult_prob_error = mean(exp|gen - prev|) = mean(2, 2) = 2
    # gen_kl_error (k3, logr = prev - gen = [-ln2, ln2]) = mean(0.5 - 1 + ln2, 2 - 1 - ln2) = 0.25
    # approx_entropy = -mean(exp(lp - gen)·lp) = -mean(0.25·ln0.5, 1·ln0.5) = 0.625·ln2
    case = LossCase(logs([[0.5, 0.5]]), t([[0.0, 0.0]]), gen=t([[LN2, -LN2]]))
    _, m, _ = case.run()
    assert m.token_mult_prob_error == pytest.approx(2.0)
    assert m.gen_kl_error == pytest.approx(0.25)
    assert m.policy_kl_error == pytest.approx(0.25)
    assert m.approx_entropy == pytest.approx(0.625 * LN2)


def test_sample_mask_drops_whole_samples_from_loss_and_counts():
    # row 2 is masked out: the loss is row 1 only, -A·r = -1 per token over 2 tokens
    case = LossCase(
        torch.zeros(2, 2, dtype=torch.float64), t([1.0, 100.0]), sample_mask=t([1.0, 0.0])
    )
    loss, m, _ = case.run()
    assert loss == pytest.approx(-1.0)
    assert (m.num_valid_tokens, m.num_valid_samples) == (2.0, 1.0)


def test_bad_shapes_and_counts_are_refused():
    case = LossCase(t([[0.0, 0.0]]), t([[1.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="advantages"):
        case.run()
    from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts
    from dockyard.config.sections.loss import ClippedPGLossConfig

    good = LossCase(t([[0.0, 0.0]]), t([[1.0, 1.0]]))
    loss_fn = ClippedPGLoss(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))
    with pytest.raises(ValueError, match="global count"):
        loss_fn(good.inputs, GlobalCounts(valid_tokens=1, valid_sequences=1))


# The engine gave the second token probability zero: gen = -inf there, so its log-ratio
# prev − gen = +inf and the token weight exp(+inf) is not finite (→ 0).
ZERO_PROB_LP = [[-1.0, -0.5, -2.0]]
ZERO_PROB_PREV = [[-1.1, -0.4, -2.0]]
ZERO_PROB_GEN = [[-1.1, -math.inf, -2.0]]


def zero_prob_and_agreeing_rows() -> LossCase:
    """Row 1: the zero-probability token; row 2: the same lp/prev with gen = prev; A = 1."""
    return LossCase(
        t(ZERO_PROB_LP * 2),
        t([1.0, 1.0]),
        prev=t(ZERO_PROB_PREV * 2),
        gen=t(ZERO_PROB_GEN + ZERO_PROB_PREV),
    )


def test_seq_mask_tis_drops_a_sequence_with_a_non_finite_log_ratio():
    # Row 1 holds the zero-probability token: its geometric-mean ratio is not finite, which lies
    # outside [0.5, 2] → dropped (loss 0 there, no gradient). Row 2 has the same lp/prev but
    # gen = prev: geometric mean 1, kept with token weights 1. r = exp(lp − prev) =
    # [e^0.1, e^-0.1, 1] (inside the clip range), A = 1 → row 2 gives −(e^0.1 + e^-0.1 + 1).
    # Token level over 6 valid tokens. (Counting the inf as agreement kept row 1: ≈ −0.70 alone.)
    case = zero_prob_and_agreeing_rows()
    loss, m, grad = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.5,
    )
    row2 = -(math.exp(0.1) + math.exp(-0.1) + 1.0)
    assert loss == pytest.approx(row2 / 6)
    assert m.is_truncated_fraction == pytest.approx(1 / 2)
    assert grad[0].abs().sum().item() == 0.0
    assert_values(grad[1], [-math.exp(0.1) / 6, -math.exp(-0.1) / 6, -1.0 / 6])


@pytest.mark.parametrize("low", [0.0, 0.5])
def test_seq_mask_tis_alone_with_a_non_finite_log_ratio_trains_nothing(low):
    # The case on its own: nothing is kept, whatever the lower bound (even 0).
    case = LossCase(t(ZERO_PROB_LP), t([1.0]), prev=t(ZERO_PROB_PREV), gen=t(ZERO_PROB_GEN))
    loss, m, grad = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=low,
    )
    assert loss == 0.0
    assert m.is_truncated_fraction == 1.0
    assert grad.abs().sum().item() == 0.0


def test_gspo_sequence_weight_is_zero_for_a_non_finite_log_ratio():
    # GSPO: r_seq = exp(mean(lp − prev)) = exp((0.1 − 0.1 + 0) / 3) = 1, A = 1 → L = −1 per
    # token. Row 1's IS weight has a non-finite log-ratio → sequence weight 0; row 2 (gen = prev)
    # has weight 1. Sequence level over 2 sequences: (0 + (−1)) / 2.
    case = zero_prob_and_agreeing_rows()
    loss, m, grad = case.run(
        use_importance_sampling_correction=True,
        sequence_level_importance_ratios=True,
        token_level_loss=False,
    )
    assert loss == pytest.approx(-0.5)
    assert (m.is_weight_min, m.is_weight_max) == pytest.approx((0.0, 1.0))
    assert grad[0].abs().sum().item() == 0.0


@pytest.mark.parametrize("token_level", [True, False])
def test_positive_example_nll_is_a_token_mean_at_either_loss_level(token_level):
    # Both rows positive, of different lengths: lp = [-1, -3] and [-5, (pad)].
    # Token mean over the 3 positive tokens: (1 + 3 + 5) / 3 = 3 (a mean of per-sequence means
    # would be (2 + 5) / 2 = 3.5). μ = 0.5, A = 0 → loss = 1.5; dNLL/dlp = -1/3 per token.
    case = LossCase(
        t([[-1.0, -3.0], [-5.0, 0.0]]),
        t([0.0, 0.0]),
        token_mask=t([[1.0, 1.0], [1.0, 0.0]]),
        rewards=t([1.0, 1.0]),
    )
    loss, m, grad = case.run(positive_example_nll_weight=0.5, token_level_loss=token_level)
    assert m.nll_loss == pytest.approx(3.0)
    assert loss == pytest.approx(1.5)
    assert_values(grad, [[-0.5 / 3, -0.5 / 3], [-0.5 / 3, 0.0]])
