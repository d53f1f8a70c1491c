"""Every ``exp`` of a log-ratio in the loss is bounded (issue 44): ``exp`` of a float32
log-ratio above ≈ 88.7 is ``inf``, and backward through it computes ``0 · inf = NaN`` even for a
clipped token whose surrogate does not depend on it. The log-ratio is clamped to ±20 first (as
verl does); inside the bound values and gradients are those of the unbounded formula.

Expected values are the formulas written out here, never the loss's own output.
"""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import LossCase, t

from dockyard.algorithms.ratios import LOG_RATIO_BOUND

DTYPES = [torch.float32, torch.bfloat16]


def f32(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def overflowing(dtype: torch.dtype, advantages: list[list[float]] | None = None) -> LossCase:
    """Issue 44's batch: lp − prev = 100 on the first of two valid tokens."""
    return LossCase(
        torch.tensor([[0.0, -1.0]], dtype=dtype),
        torch.tensor(advantages or [[1.0, 1.0]], dtype=dtype),
        prev=torch.tensor([[-100.0, -1.0]], dtype=dtype),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_clipped_token_with_an_overflowing_ratio_has_zero_gradient_not_nan(dtype):
    # A > 0 and r = e^100 > 1 + ε: the clipped side −A·(1 + ε) is taken, so the token's
    # gradient is 0; the other token has r = 1: −A·r/N → d/dlp = −1·1/2.
    loss, _, grad = overflowing(dtype).run()
    assert loss == pytest.approx((-1.2 - 1.0) / 2, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.5]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cispo_with_an_overflowing_ratio_weights_by_the_clamped_ratio(dtype):
    # −A·sg(clamp(r))·lp: d/dlp = −A·clamp(r)/N = [−1.2/2, −1/2].
    loss, metrics, grad = overflowing(dtype).run(use_cispo=True)
    assert loss == pytest.approx(-(1.2 * 0.0 + 1.0 * -1.0) / 2, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-0.6, -0.5]], dtype=dtype))
    # What the surrogate used, reported finite: the bounded ratio e^20.
    assert metrics.ratio_max == pytest.approx(math.exp(LOG_RATIO_BOUND), rel=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gspo_sequence_ratio_that_overflows_has_zero_gradient_not_nan(dtype):
    # Sequence 0: mean(lp − prev) = (200 + 0)/2 = 100, s = e^100 clipped (A > 0): gradient 0.
    # Sequence 1: s = exp(mean(0, 0)) = 1, −A·s per token, ∂s/∂lp_t = s/2, sequence mean then
    # divided by 2 sequences: d/dlp_t = −1·(1/2)/2 = −0.25.
    case = LossCase(
        torch.tensor([[0.0, -1.0], [-1.0, -1.0]], dtype=dtype),
        torch.ones(2, 2, dtype=dtype),
        prev=torch.tensor([[-200.0, -1.0], [-1.0, -1.0]], dtype=dtype),
    )
    loss, _, grad = case.run(sequence_level_importance_ratios=True, token_level_loss=False)
    assert loss == pytest.approx((-1.2 - 1.0) / 2, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0], [-0.25, -0.25]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_overflowing_is_weight_is_bounded_then_truncated_not_dropped(dtype):
    # prev − gen = 100 on token 0: w = e^100 would overflow to inf (and was then zeroed,
    # silently dropping the token); bounded it is e^20, and TIS clamps it to its max 2.
    # lp = prev (r = 1): loss = −(2·1 + 1·1)/2, d/dlp = −w·A/N = [−1, −0.5].
    lp = torch.tensor([[-1.0, -1.0]], dtype=dtype)
    case = LossCase(
        lp, torch.ones(1, 2, dtype=dtype), prev=lp, gen=torch.tensor([[-101.0, -1.0]], dtype=dtype)
    )
    loss, metrics, grad = case.run(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
    )
    assert loss == pytest.approx(-1.5, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -0.5]], dtype=dtype))
    assert metrics.is_weight_max == pytest.approx(math.exp(LOG_RATIO_BOUND), rel=1e-6)


def test_an_overflowing_sequence_is_weight_is_bounded():
    # GSPO's weight exp(mean_t(prev − gen)) = exp(100) (inf in float32) is bounded to e^20 and
    # truncated to 2.
    lp = f32([[-1.0, -1.0]])
    case = LossCase(lp, f32([[1.0, 1.0]]), prev=lp, gen=f32([[-201.0, -1.0]]))
    loss, metrics, grad = case.run(
        sequence_level_importance_ratios=True,
        token_level_loss=False,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
    )
    # s = 1, w = 2: loss = −w·A = −2; d/dlp_t = −w·A·(s/2)/1 sequence = −1.
    assert loss == pytest.approx(-2.0)
    torch.testing.assert_close(grad, f32([[-1.0, -1.0]]))
    assert metrics.is_weight_max == pytest.approx(math.exp(LOG_RATIO_BOUND), rel=1e-6)


def test_a_non_finite_log_ratio_still_drops_its_token():
    # The bound is for finite log-ratios; gen = −inf (probability zero) still gives weight 0.
    lp = t([[-1.0, -1.0]])
    case = LossCase(lp, t([[1.0, 1.0]]), prev=lp, gen=t([[-math.inf, -1.0]]))
    loss, _, grad = case.run(use_importance_sampling_correction=True)
    assert loss == pytest.approx(-0.5)
    torch.testing.assert_close(grad, t([[0.0, -0.5]]))


def test_the_on_policy_kl_weight_is_bounded():
    # KL term weighted by sg(exp(lp − gen)): lp − gen = 100 on token 0 gives e^20 (bounded),
    # not inf (which was zeroed). k1 = lp − ref = [0.5, 0]; β = 1, token mean over 2 tokens.
    lp = f32([[0.0, -1.0]])
    case = LossCase(
        lp, f32([[0.0, 0.0]]), prev=lp, gen=f32([[-100.0, -1.0]]), ref=f32([[-0.5, -1.0]])
    )
    _, metrics, grad = case.run(
        reference_policy_kl_penalty=1.0,
        reference_policy_kl_type="k1",
        use_on_policy_kl_approximation=True,
    )
    bound = math.exp(LOG_RATIO_BOUND)
    assert metrics.kl == pytest.approx(bound * 0.5 / 2, rel=1e-6)
    # ∂(w·k1)/∂lp = w (w detached): [e^20, 1]/2.
    torch.testing.assert_close(grad, f32([[bound / 2, 0.5]]))


CONFIGS = {
    "ppo": {},
    "ppo_is": {"use_importance_sampling_correction": True},
    "gspo_is": {
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "use_importance_sampling_correction": True,
    },
}


def _unbounded(name: str, lp, prev, gen, advantages, mask) -> torch.Tensor:
    """The loss by its formula with plain ``exp`` (no bound), to compare inside the bound."""
    if name == "gspo_is":
        n = mask.sum(-1)
        ratio = torch.exp(((lp - prev) * mask).sum(-1) / n).unsqueeze(-1)
        weight = torch.exp(((prev - gen) * mask).sum(-1) / n).unsqueeze(-1)
    else:
        ratio = torch.exp(lp - prev)
        weight = torch.exp(prev - gen) if name == "ppo_is" else torch.ones_like(lp)
    per = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)) * weight
    if name == "gspo_is":
        return ((per * mask).sum(-1) / mask.sum(-1)).sum() / lp.shape[0]
    return (per * mask).sum() / mask.sum()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_inside_the_bound_values_and_gradients_are_the_unbounded_formulas(name):
    # Log-ratios spread over (−19, 19), both advantage signs: every ratio and weight is inside
    # the bound, so the loss and its gradient equal those of the plain-exp formula.
    generator = torch.Generator().manual_seed(0)
    shape = (4, 5)
    lp = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    spread = (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * 19
    prev = lp - spread
    gen = prev - (torch.rand(shape, generator=generator, dtype=torch.float64) * 2 - 1) * 19
    if name == "gspo_is":  # keep the sequence means inside the bound as well
        assert ((lp - prev).mean(-1).abs() < LOG_RATIO_BOUND).all()
    advantages = torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = torch.ones(shape, dtype=torch.float64)

    leaf = lp.clone().requires_grad_(True)
    expected = _unbounded(name, leaf, prev, gen, advantages, mask)
    expected.backward()
    assert leaf.grad is not None
    case = LossCase(lp, advantages, prev=prev, gen=gen)
    loss, _, grad = case.run(**CONFIGS[name])
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-12, atol=0.0)
