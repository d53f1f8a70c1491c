"""Properties of ClippedPGLoss on random batches: accumulation, masking, IS, bounds."""

from __future__ import annotations

import math

import pytest
import torch

from dockyard.algorithms.importance import importance_weights, sequence_geometric_mean_weight
from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts, LossInputs
from dockyard.algorithms.loss_metrics import merge_loss_metrics
from dockyard.config.sections.loss import ClippedPGLossConfig

B, T = 8, 12


def random_batch(seed: int = 0, dtype: torch.dtype = torch.float64) -> LossInputs:
    g = torch.Generator().manual_seed(seed)
    prev = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    token_mask = (torch.arange(T) < lengths.unsqueeze(-1)).to(dtype)
    return LossInputs(
        logprobs=(prev + 0.3 * torch.randn(B, T, generator=g, dtype=dtype)).requires_grad_(True),
        prev_logprobs=prev,
        generation_logprobs=prev + 0.2 * torch.randn(B, T, generator=g, dtype=dtype),
        advantages=torch.randn(B, generator=g, dtype=dtype),
        token_mask=token_mask,
        sample_mask=(torch.arange(B) != 3).to(dtype),  # one sample dropped
        reference_logprobs=prev + 0.1 * torch.randn(B, T, generator=g, dtype=dtype),
        rewards=torch.randn(B, generator=g, dtype=dtype),
    )


def with_logprobs(inputs: LossInputs, **changes: torch.Tensor) -> LossInputs:
    fields = {**inputs.__dict__, **changes}
    fields["logprobs"] = fields["logprobs"].detach().clone().requires_grad_(True)
    return LossInputs(**fields)


def loss_and_grad(cfg: ClippedPGLossConfig, inputs: LossInputs):
    inputs = with_logprobs(inputs)
    counts = GlobalCounts.from_batch(inputs.token_mask, inputs.sample_mask, inputs.rewards)
    loss, metrics = ClippedPGLoss(cfg)(inputs, counts)
    loss.backward()
    return loss.detach(), inputs.logprobs.grad, metrics


def rows(inputs: LossInputs, index: slice) -> LossInputs:
    return LossInputs(
        **{name: None if value is None else value[index] for name, value in inputs.__dict__.items()}
    )


CONFIGS = {
    "ppo-token": dict(ratio_clip_c=3.0),
    "ppo-sequence": dict(token_level_loss=False),
    "gspo-is": dict(
        token_level_loss=False,
        sequence_level_importance_ratios=True,
        use_importance_sampling_correction=True,
    ),
    "tis-kl-nll": dict(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=1.1,
        use_on_policy_kl_approximation=True,
        positive_example_nll_weight=0.3,
    ),
    "icepop-sequence": dict(
        token_level_loss=False,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=1.2,
        truncated_importance_sampling_ratio_min=0.8,
    ),
    "cispo": dict(use_cispo=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_micro_batches_sum_to_the_full_batch(name):
    cfg = ClippedPGLossConfig(**CONFIGS[name])
    full = with_logprobs(random_batch())
    full_loss, full_grad, full_metrics = loss_and_grad(cfg, full)

    counts = GlobalCounts.from_batch(full.token_mask, full.sample_mask, full.rewards)
    leaf = full.logprobs.detach().clone().requires_grad_(True)
    total, parts = torch.zeros((), dtype=torch.float64), []
    for start in range(0, B, 3):  # uneven micro-batches: 3, 3, 2
        part = slice(start, start + 3)
        micro = LossInputs(**{**rows(full, part).__dict__, "logprobs": leaf[part]})
        loss, metrics = ClippedPGLoss(cfg)(micro, counts)
        loss.backward()
        total = total + loss.detach()
        parts.append(metrics)

    torch.testing.assert_close(total, full_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(leaf.grad, full_grad, rtol=1e-12, atol=1e-12)
    merged = merge_loss_metrics(parts).as_dict()
    for key, value in full_metrics.as_dict().items():
        assert merged[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("name", list(CONFIGS))
def test_is_correction_with_gen_equal_prev_is_no_correction(name):
    settings = {k: v for k, v in CONFIGS[name].items() if "importance" not in k}
    batch = random_batch(1)
    on_policy = with_logprobs(batch, generation_logprobs=batch.prev_logprobs.clone())
    corrected = ClippedPGLossConfig(
        **settings,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=1.5,
        truncated_importance_sampling_ratio_min=0.5,
    )
    plain = ClippedPGLossConfig(**settings)
    loss_a, grad_a, metrics = loss_and_grad(corrected, on_policy)
    loss_b, grad_b, _ = loss_and_grad(plain, on_policy)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)
    assert metrics.is_weight_mean == pytest.approx(1.0)
    assert metrics.is_truncated_fraction == 0.0


def test_disable_ppo_ratio_gradient_is_reinforce():
    batch = random_batch(2)
    cfg = ClippedPGLossConfig(disable_ppo_ratio=True, reference_policy_kl_penalty=0.0)
    _, grad, _ = loss_and_grad(cfg, batch)
    # REINFORCE: ∇ Σ_valid (−A·lp) / N = −A·mask / N
    mask = batch.token_mask * batch.sample_mask.unsqueeze(-1)
    expected = -batch.advantages.unsqueeze(-1) * mask / mask.sum()
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_masked_tokens_have_zero_gradient_even_with_garbage(name):
    batch = random_batch(3)
    mask = (batch.token_mask * batch.sample_mask.unsqueeze(-1)).bool()
    poison = {
        "prev_logprobs": torch.where(mask, batch.prev_logprobs, torch.nan),
        "generation_logprobs": torch.where(mask, batch.generation_logprobs, -torch.inf),
        "reference_logprobs": torch.where(mask, batch.reference_logprobs, torch.inf),
        "logprobs": torch.where(mask, batch.logprobs.detach(), torch.nan),
    }
    loss, grad, _ = loss_and_grad(
        ClippedPGLossConfig(**CONFIGS[name]), with_logprobs(batch, **poison)
    )
    assert torch.isfinite(loss)
    assert torch.all(grad[~mask] == 0)
    assert torch.all(torch.isfinite(grad))
    assert torch.any(grad[mask] != 0)


def test_dual_clip_bounds_the_loss_for_negative_advantages():
    g = torch.Generator().manual_seed(4)
    c = 3.0
    advantages = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1  # all negative
    huge = torch.rand(B, T, generator=g, dtype=torch.float64) * 50  # ratios up to e^50
    batch = LossInputs(
        logprobs=huge.requires_grad_(True),
        prev_logprobs=torch.zeros(B, T, dtype=torch.float64),
        generation_logprobs=torch.zeros(B, T, dtype=torch.float64),
        advantages=advantages,
        token_mask=torch.ones(B, T),
        sample_mask=torch.ones(B),
    )
    cfg = ClippedPGLossConfig(ratio_clip_c=c, reference_policy_kl_penalty=0.0)
    loss, grad, metrics = loss_and_grad(cfg, batch)
    bound = (c * advantages.abs()).mean()
    assert loss <= bound + 1e-12
    assert metrics.dual_clip_fraction > 0.5
    # where the bound binds (ratio > c) the loss is flat in lp
    assert torch.all(grad[huge > math.log(c)] == 0)
    unclipped, _, _ = loss_and_grad(ClippedPGLossConfig(reference_policy_kl_penalty=0.0), batch)
    assert unclipped > 1e6  # without dual clip the same batch explodes


def test_sequence_weights_stay_finite_on_32k_token_sequences():
    tokens = 32_768
    drift = torch.full((2, tokens), 0.01, dtype=torch.float32)
    drift[1] = -0.01  # prev − gen per token: +0.01 on row 0, −0.01 on row 1
    prev = torch.zeros(2, tokens, dtype=torch.float32)
    mask = torch.ones(2, tokens, dtype=torch.bool)
    geo = sequence_geometric_mean_weight(prev, prev - drift, mask)
    torch.testing.assert_close(geo, torch.tensor([math.exp(0.01), math.exp(-0.01)]))
    # the exp(sum) the reference system uses overflows / underflows here
    naive = torch.exp(drift.sum(dim=-1))
    assert math.isinf(naive[0].item()) and naive[1].item() == 0.0
    cfg = ClippedPGLossConfig(
        use_importance_sampling_correction=True,
        sequence_level_importance_ratios=True,
        token_level_loss=False,
    )
    weights = importance_weights(prev, prev - drift, mask, cfg)
    assert torch.all(torch.isfinite(weights.weights)) and torch.all(weights.weights > 0.98)


def test_bf16_inputs_are_computed_in_float32():
    batch = random_batch(5, dtype=torch.bfloat16)
    cfg = ClippedPGLossConfig(**CONFIGS["tis-kl-nll"])
    loss, grad, _ = loss_and_grad(cfg, batch)
    assert loss.dtype == torch.float32
    assert grad.dtype == torch.bfloat16 and torch.all(torch.isfinite(grad.float()))
