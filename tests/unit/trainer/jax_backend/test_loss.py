"""The JAX loss is the torch loss: same value, same gradient, same metrics, for every option.

The torch :class:`ClippedPGLoss` is the reference definition (its own tests check it against the
formulas); here both run on the same random float32 batch — with masked samples, padding that
holds NaN/-inf, off-policy engine log-probs and both advantage signs — and must agree to float32
rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts, LossInputs
from dockyard.config.sections.loss import ClippedPGLossConfig
from dockyard.consumers.trainer.jax_backend.loss import (
    METRIC_NAMES,
    LossBatch,
    clipped_pg_loss,
    count_batch,
    initial_metric_vector,
    loss_metrics,
    merge_metric_vectors,
)

B, T = 6, 9

CASES: dict[str, dict[str, object]] = {
    "grpo_default": {},
    "dual_clip": {"ratio_clip_c": 1.1},
    "sequence_level": {"token_level_loss": False},
    "gspo": {"sequence_level_importance_ratios": True, "token_level_loss": False},
    "cispo": {"use_cispo": True},
    "reinforce": {"disable_ppo_ratio": True},
    "force_on_policy": {"force_on_policy_ratio": True, "use_importance_sampling_correction": True},
    "is_plain": {"use_importance_sampling_correction": True},
    "tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 1.3,
        "truncated_importance_sampling_ratio_min": 0.8,
    },
    "icepop": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio": 1.3,
        "truncated_importance_sampling_ratio_min": 0.8,
    },
    "seq_mask_tis": {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "seq-mask-tis",
        "truncated_importance_sampling_ratio": 1.2,
        "truncated_importance_sampling_ratio_min": 0.9,
    },
    "gspo_tis": {
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 1.05,
    },
    "kl_k1_on_policy": {
        "reference_policy_kl_penalty": 0.3,
        "reference_policy_kl_type": "k1",
        "use_on_policy_kl_approximation": True,
    },
    "kl_k2_clamped": {
        "reference_policy_kl_penalty": 0.3,
        "reference_policy_kl_type": "k2",
        "kl_input_clamp_value": 0.2,
        "kl_output_clamp_value": 0.01,
    },
    "kl_in_reward": {"reference_policy_kl_penalty": 0.3, "use_kl_in_reward": True},
    "positive_nll": {"positive_example_nll_weight": 0.7},
}


# The metric that shows each case's option acted on this batch (else the case proves nothing).
ACTS: dict[str, str] = {
    "grpo_default": "clip_fraction",
    "dual_clip": "dual_clip_fraction",
    "tis": "is_truncated_fraction",
    "icepop": "is_truncated_fraction",
    "seq_mask_tis": "is_truncated_fraction",
    "gspo_tis": "is_truncated_fraction",
    "kl_k1_on_policy": "kl_loss",
    "kl_k2_clamped": "kl_loss",
    "kl_in_reward": "kl",
    "positive_nll": "nll_loss",
}


def _batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    token_mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    lp = np.log(rng.uniform(0.05, 0.95, size=(B, T))).astype(np.float32)
    values = {
        "logprobs": lp,
        "prev_logprobs": (lp + rng.normal(0, 0.2, size=(B, T))).astype(np.float32),
        "generation_logprobs": (lp + rng.normal(0, 0.3, size=(B, T))).astype(np.float32),
        "reference_logprobs": (lp + rng.normal(0, 0.4, size=(B, T))).astype(np.float32),
        "advantages": rng.normal(0, 1.0, size=(B, T)).astype(np.float32),
        "token_mask": token_mask,
        "sample_mask": np.array([1, 1, 0, 1, 1, 1], np.float32),
        "rewards": np.array([1.0, 0.0, 1.0, -0.5, 2.0, 0.0], np.float32),
    }
    # Padding holds what an engine may leave there; it must never leak into a sum or gradient.
    for key in ("prev_logprobs", "generation_logprobs", "reference_logprobs"):
        values[key] = np.where(token_mask > 0, values[key], np.nan).astype(np.float32)
    values["logprobs"] = np.where(token_mask > 0, lp, -np.inf).astype(np.float32)
    return values


def _torch(cfg: ClippedPGLossConfig, values: dict[str, np.ndarray], rows: slice = slice(None)):
    as_t = {k: torch.from_numpy(v.copy()) for k, v in values.items()}
    counts = GlobalCounts.from_batch(as_t["token_mask"], as_t["sample_mask"], as_t["rewards"])
    logprobs = as_t["logprobs"][rows].clone().requires_grad_(True)
    inputs = LossInputs(
        logprobs=logprobs,
        **{k: v[rows] for k, v in as_t.items() if k != "logprobs"},
    )
    loss, metrics = ClippedPGLoss(cfg)(inputs, counts)
    loss.backward()
    return loss.item(), logprobs.grad.numpy(), metrics


def _jax(cfg: ClippedPGLossConfig, values: dict[str, np.ndarray], rows: slice = slice(None)):
    j = {k: jnp.asarray(v) for k, v in values.items()}
    counts = count_batch(j["token_mask"], j["sample_mask"], j["rewards"])
    batch = LossBatch(**{k: v[rows] for k, v in j.items() if k != "logprobs"})

    def loss_of(lp):
        return clipped_pg_loss(cfg, lp, batch, counts)

    (loss, vector), grad = jax.jit(jax.value_and_grad(loss_of, has_aux=True))(j["logprobs"][rows])
    return float(loss), np.asarray(grad), vector


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_gradient_and_metrics_match_torch(name):
    cfg = ClippedPGLossConfig(**CASES[name])
    assert not cfg.rule_issues(), cfg.rule_issues()
    values = _batch()
    t_loss, t_grad, t_metrics = _torch(cfg, values)
    j_loss, j_grad, j_vector = _jax(cfg, values)
    np.testing.assert_allclose(j_loss, t_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(j_grad, t_grad, rtol=1e-5, atol=1e-7)
    assert np.isfinite(j_grad).all()
    j_metrics = loss_metrics(j_vector).as_dict()
    if name in ACTS:
        assert t_metrics.as_dict()[ACTS[name]] != 0, f"{name}: the option never acted"
    for key, expected in t_metrics.as_dict().items():
        np.testing.assert_allclose(j_metrics[key], expected, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("name", ["grpo_default", "gspo", "tis"])
def test_micro_batch_shares_sum_to_the_full_batch(name):
    """Global normalisation: two halves' losses and merged metrics equal the whole batch's,
    as the torch backend's micro-batches do."""
    cfg = ClippedPGLossConfig(**CASES[name])
    values = _batch(seed=3)
    full_loss, full_grad, _ = _jax(cfg, values)
    first = _jax(cfg, values, slice(0, 3))
    second = _jax(cfg, values, slice(3, B))
    np.testing.assert_allclose(first[0] + second[0], full_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.concatenate([first[1], second[1]]), full_grad, rtol=1e-5)
    merged = merge_metric_vectors(
        merge_metric_vectors(initial_metric_vector(), first[2]), second[2]
    )
    _, _, torch_full = _torch(cfg, values)
    for index, key in enumerate(METRIC_NAMES):
        expected = torch_full.as_dict()[key]
        np.testing.assert_allclose(
            float(merged[index]), expected, rtol=1e-5, atol=1e-6, err_msg=key
        )


def _overflowing_batch() -> dict[str, np.ndarray]:
    """Log-ratios far past float32's ``exp`` range (issue 44): lp − prev = 100 on token (0, 0),
    a sequence mean of 100 in row 1, prev − gen = 100 and lp − gen = 100 on token (2, 0); the
    other tokens are on-policy. Advantages of both signs."""
    lp = np.array([[0.0, -1.0], [0.0, -1.0], [-1.0, -1.0]], np.float32)
    prev = np.array([[-100.0, -1.0], [-200.0, -1.0], [-1.0, -1.0]], np.float32)
    gen = np.array([[-100.0, -1.0], [-200.0, -1.0], [-101.0, -1.0]], np.float32)
    return {
        "logprobs": lp,
        "prev_logprobs": prev,
        "generation_logprobs": gen,
        "reference_logprobs": lp - np.float32(0.5),
        "advantages": np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0]], np.float32),
        "token_mask": np.ones((3, 2), np.float32),
        "sample_mask": np.ones(3, np.float32),
        "rewards": np.array([1.0, 0.0, 1.0], np.float32),
    }


@pytest.mark.parametrize(
    "name", ["grpo_default", "gspo", "cispo", "tis", "gspo_tis", "kl_k1_on_policy"]
)
def test_overflowing_log_ratios_are_bounded_as_in_torch(name):
    # The JAX twin bounds every log-ratio before exp as the torch loss does: the same finite
    # value and gradient (tests/unit/algorithms/test_ratio_bound.py checks torch's by formula).
    cfg = ClippedPGLossConfig(**CASES[name])
    values = _overflowing_batch()
    t_loss, t_grad, t_metrics = _torch(cfg, values)
    j_loss, j_grad, j_vector = _jax(cfg, values)
    assert np.isfinite(t_grad).all() and np.isfinite(j_grad).all()
    np.testing.assert_allclose(j_loss, t_loss, rtol=1e-5)
    np.testing.assert_allclose(j_grad, t_grad, rtol=1e-5, atol=1e-7)
    j_metrics = loss_metrics(j_vector).as_dict()
    for key in ("ratio_max", "is_weight_max", "kl"):
        np.testing.assert_allclose(j_metrics[key], t_metrics.as_dict()[key], rtol=1e-5, err_msg=key)
