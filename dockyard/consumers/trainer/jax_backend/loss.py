"""The clipped policy-gradient loss in JAX: :mod:`dockyard.algorithms.loss` for this backend.

One definition of the math per framework: this module is the JAX twin of
``dockyard/algorithms/{loss,importance,kl,masked}.py`` — the same surrogate (PPO / GRPO dual
clip, GSPO, CISPO, REINFORCE), the same importance-sampling correction and truncation, the same
reference KL and the same global normalisation (token or sequence level, divided by counts of
the whole batch, so micro-batch losses sum to the full-batch loss). The formulas and their
reasons are documented there; ``tests/unit/trainer/jax_backend/test_loss.py`` checks this module
against the torch one on the same inputs, value and gradient, for every option.

Everything here is traceable under ``jax.jit``: the config is static (closed over), counts are
traced scalars, and no Python branch depends on data. Metrics come back as a vector in the order
of :class:`~dockyard.algorithms.loss_metrics.LossMetrics`' fields, ready to merge across
micro-batches on the device (:func:`merge_metric_vectors`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp

from dockyard.algorithms.loss_metrics import LossMetrics
from dockyard.algorithms.ratios import LOG_RATIO_BOUND
from dockyard.config.sections.loss import ClippedPGLossConfig, KLType

Array = jax.Array
sg = jax.lax.stop_gradient


# ---- masked reductions (dockyard.algorithms.masked) --------------------------------------------


def zero_where_masked(values: Array, mask: Array) -> Array:
    # Selected away, not multiplied by 0: a NaN in padding must not reach a sum or a gradient.
    return jnp.where(mask, values, jnp.zeros((), values.dtype))


def masked_sum(values: Array, mask: Array, axis: int | None = None) -> Array:
    return zero_where_masked(values, mask).sum(axis=axis)


def per_sequence_mean(values: Array, mask: Array) -> Array:
    counts = jnp.maximum(mask.astype(values.dtype).sum(axis=-1), 1.0)
    return masked_sum(values, mask, axis=-1) / counts


def finite_or_zero(values: Array) -> Array:
    return jnp.where(jnp.isfinite(values), values, jnp.zeros((), values.dtype))


def bounded_exp(log_ratio: Array) -> Array:
    # dockyard.algorithms.ratios: exp of a float32 log-ratio past ≈ 88.7 is inf, and backward
    # through it gives a NaN gradient even for a clipped token.
    return jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def bounded_weight(log_ratio: Array) -> Array:
    # A non-finite log-ratio (probability zero, NaN) is no weight: 0, not the bound.
    finite = jnp.isfinite(log_ratio)
    return jnp.where(finite, bounded_exp(jnp.where(finite, log_ratio, 0.0)), 0.0)


def masked_min(values: Array, mask: Array) -> Array:
    return jnp.where(mask, values, jnp.inf).min()


def masked_max(values: Array, mask: Array) -> Array:
    return jnp.where(mask, values, -jnp.inf).max()


# ---- counts ----------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Counts:
    """:class:`~dockyard.algorithms.loss.GlobalCounts` as traced scalars (whole-batch counts)."""

    valid_tokens: Array
    valid_sequences: Array
    positive_tokens: Array


def count_batch(token_mask: Array, sample_mask: Array, rewards: Array) -> Counts:
    mask = token_mask.astype(bool) & sample_mask.astype(bool)[:, None]
    has_tokens = mask.any(axis=-1)
    positive = mask & (rewards > 0)[:, None]
    return Counts(
        mask.sum().astype(jnp.float32),
        has_tokens.sum().astype(jnp.float32),
        positive.sum().astype(jnp.float32),
    )


# ---- KL (dockyard.algorithms.kl) ---------------------------------------------------------------


def kl_estimate(
    logprobs: Array,
    reference_logprobs: Array,
    kl_type: KLType = "k3",
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> Array:
    log_ratio = reference_logprobs - logprobs
    if input_clamp is not None:
        log_ratio = jnp.clip(log_ratio, -input_clamp, input_clamp)
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = jnp.square(log_ratio) / 2
    elif kl_type == "k3":
        kl = jnp.exp(log_ratio) - 1 - log_ratio
    else:
        raise ValueError(f"unknown KL type {kl_type!r}; choose k1, k2 or k3")
    if output_clamp is not None:
        kl = jnp.clip(kl, -output_clamp, output_clamp)
    return kl


# ---- importance weights (dockyard.algorithms.importance) ---------------------------------------


@dataclass(frozen=True)
class _Weights:
    weights: Array
    raw: Array
    raw_mask: Array
    truncated: Array
    per_sequence: bool
    truncation_per_sequence: bool


def _sequence_geometric_mean_weight(prev: Array, gen: Array, mask: Array) -> Array:
    log_ratio = zero_where_masked(prev - gen, mask)
    all_finite = jnp.isfinite(log_ratio).all(axis=-1)
    weight = bounded_weight(per_sequence_mean(finite_or_zero(log_ratio), mask))
    return jnp.where(all_finite, weight, 0.0)


def _importance_weights(prev: Array, gen: Array, mask: Array, cfg: ClippedPGLossConfig) -> _Weights:
    valid_sequences = mask.any(axis=-1, keepdims=True)
    kind = cfg.truncated_importance_sampling_type
    if cfg.sequence_level_importance_ratios:
        raw = _sequence_geometric_mean_weight(prev, gen, mask)[:, None]
        raw_mask = valid_sequences
    else:
        raw = bounded_weight(zero_where_masked(prev - gen, mask))
        raw_mask = mask
    low, high = cfg.truncated_importance_sampling_ratio_min, cfg.truncated_importance_sampling_ratio
    truncation_mask = raw_mask
    if kind is None:
        weights, truncated = raw, jnp.zeros_like(raw_mask)
    elif kind == "seq-mask-tis":
        assert low is not None and high is not None  # ClippedPGLossConfig.rule_issues
        geo = _sequence_geometric_mean_weight(prev, gen, mask)[:, None]
        kept = (geo > 0) & (geo >= low) & (geo <= high)
        weights = raw * kept.astype(raw.dtype)
        truncated, truncation_mask = ~kept, valid_sequences
    elif kind == "tis":
        assert high is not None
        low_bound = 0.0 if low is None else low
        weights = jnp.clip(raw, low_bound, high)
        truncated = (raw < low_bound) | (raw > high)
    else:  # icepop
        assert low is not None and high is not None
        kept = (raw >= low) & (raw <= high)
        weights, truncated = jnp.where(kept, raw, 0.0), ~kept
    if not cfg.use_importance_sampling_correction:
        weights = jnp.ones_like(raw)
    return _Weights(
        weights=weights,
        raw=raw,
        raw_mask=raw_mask,
        truncated=truncated & truncation_mask,
        per_sequence=cfg.sequence_level_importance_ratios,
        truncation_per_sequence=cfg.sequence_level_importance_ratios or kind == "seq-mask-tis",
    )


# ---- the loss --------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LossBatch:
    """One micro-batch, as :class:`~dockyard.algorithms.loss.LossInputs` (``[B, T]`` / ``[B]``;
    ``advantages`` per token). ``reference_logprobs`` may be None when no KL term needs it."""

    prev_logprobs: Array
    generation_logprobs: Array
    advantages: Array
    token_mask: Array
    sample_mask: Array
    rewards: Array
    reference_logprobs: Array | None = None


METRIC_NAMES: tuple[str, ...] = tuple(f.name for f in fields(LossMetrics))
# LossMetrics' own merge rules (sum / min / max per field), so the two backends merge alike.
_MERGE_RULES: tuple[str, ...] = tuple(f.metadata["merge"] for f in fields(LossMetrics))


def clipped_pg_loss(
    cfg: ClippedPGLossConfig, logprobs: Array, batch: LossBatch, counts: Counts
) -> tuple[Array, Array]:
    """``(loss, metrics)`` of one micro-batch: its share of the full-batch loss, and the
    :class:`LossMetrics` values as a vector (``METRIC_NAMES`` order)."""
    kl_in_loss = cfg.reference_policy_kl_penalty != 0 and not cfg.use_kl_in_reward
    if kl_in_loss and batch.reference_logprobs is None:
        raise ValueError(
            "loss_fn.reference_policy_kl_penalty != 0 needs reference_logprobs "
            "(or set loss_fn.use_kl_in_reward=true / the penalty to 0)"
        )
    mask = batch.token_mask.astype(bool) & batch.sample_mask.astype(bool)[:, None]
    lp = zero_where_masked(logprobs.astype(jnp.float32), mask)
    prev = zero_where_masked(sg(batch.prev_logprobs.astype(jnp.float32)), mask)
    gen = zero_where_masked(sg(batch.generation_logprobs.astype(jnp.float32)), mask)
    advantages = zero_where_masked(sg(batch.advantages.astype(jnp.float32)), mask)
    if cfg.force_on_policy_ratio:
        prev = sg(lp)

    def reduce(values: Array) -> Array:
        values = jnp.broadcast_to(values, mask.shape)
        if cfg.token_level_loss:
            return masked_sum(values, mask) / jnp.maximum(counts.valid_tokens, 1.0)
        return per_sequence_mean(values, mask).sum() / jnp.maximum(counts.valid_sequences, 1.0)

    # -- surrogate (ClippedPGLoss._surrogate)
    low, high = 1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max
    no_clip = jnp.zeros_like(mask)
    if cfg.force_on_policy_ratio:
        ratio = jnp.exp(lp - sg(lp))
        ratio_clamped, clipped = ratio, no_clip
    else:
        if cfg.sequence_level_importance_ratios:
            sequence_ratio = bounded_exp(per_sequence_mean(lp - prev, mask))
            ratio = jnp.broadcast_to(sequence_ratio[:, None], lp.shape)
        else:
            ratio = bounded_exp(lp - prev)
        ratio_clamped = jnp.clip(ratio, low, high)
        clipped = (sg(ratio) < low) | (sg(ratio) > high)
    if cfg.disable_ppo_ratio:
        per_token = -advantages * lp
        ratio_clamped, clipped = ratio, no_clip
    elif cfg.use_cispo:
        per_token = -advantages * sg(ratio_clamped) * lp
    else:
        per_token = jnp.maximum(-advantages * ratio, -advantages * ratio_clamped)
    dual_clipped = no_clip
    if cfg.ratio_clip_c is not None:
        bound = -advantages * cfg.ratio_clip_c
        dual_clipped = (advantages < 0) & (sg(per_token) > bound)
        per_token = jnp.where(dual_clipped, bound, per_token)
    clipped, dual_clipped = clipped & mask, dual_clipped & mask

    weights = _importance_weights(prev, gen, mask, cfg)
    actor_loss = reduce(sg(weights.weights) * per_token)

    kl_term = jnp.zeros((), jnp.float32)
    if batch.reference_logprobs is not None:
        ref = zero_where_masked(sg(batch.reference_logprobs.astype(jnp.float32)), mask)
        kl_per_token = kl_estimate(
            lp,
            ref,
            cfg.reference_policy_kl_type,
            cfg.kl_input_clamp_value,
            cfg.kl_output_clamp_value,
        )
        if cfg.use_on_policy_kl_approximation:
            kl_per_token = sg(bounded_weight(lp - gen)) * kl_per_token
        kl_term = reduce(kl_per_token)
    kl_loss = cfg.reference_policy_kl_penalty * kl_term if kl_in_loss else jnp.zeros_like(kl_term)

    nll = jnp.zeros((), jnp.float32)
    if cfg.positive_example_nll_weight != 0:
        positive = mask & (sg(batch.rewards) > 0)[:, None]
        nll = masked_sum(-lp, positive) / jnp.maximum(counts.positive_tokens, 1.0)
    loss = actor_loss + kl_loss + cfg.positive_example_nll_weight * nll

    # -- metrics (ClippedPGLoss._metrics), from detached values
    lp_d, ratio_d = sg(lp), sg(ratio)
    n_tok = jnp.maximum(counts.valid_tokens, 1.0)
    n_seq = jnp.maximum(counts.valid_sequences, 1.0)
    is_norm = n_seq if weights.per_sequence else n_tok
    trunc_norm = n_seq if weights.truncation_per_sequence else n_tok

    def token_mean(values: Array) -> Array:
        return masked_sum(values, mask) / n_tok

    raw = jnp.broadcast_to(weights.raw, weights.raw_mask.shape)
    values = {
        "loss": sg(loss),
        "actor_loss": sg(actor_loss),
        "kl_loss": sg(kl_loss),
        "kl": sg(kl_term),
        "nll_loss": sg(nll),
        "ratio_mean": token_mean(ratio_d),
        "ratio_min": masked_min(ratio_d, mask),
        "ratio_max": masked_max(ratio_d, mask),
        "ratio_clamped_mean": token_mean(sg(ratio_clamped)),
        "clip_fraction": clipped.sum() / n_tok,
        "dual_clip_fraction": dual_clipped.sum() / n_tok,
        "is_weight_mean": masked_sum(raw, weights.raw_mask) / is_norm,
        "is_weight_min": masked_min(raw, weights.raw_mask),
        "is_weight_max": masked_max(raw, weights.raw_mask),
        "is_truncated_fraction": weights.truncated.sum() / trunc_norm,
        "token_mult_prob_error": token_mean(jnp.exp(jnp.abs(gen - prev))),
        "gen_kl_error": token_mean(kl_estimate(gen, prev, "k3")),
        "policy_kl_error": token_mean(kl_estimate(prev, gen, "k3")),
        "approx_entropy": -token_mean(jnp.exp(lp_d - gen) * lp_d),
        "num_valid_tokens": mask.sum(),
        "num_valid_samples": mask.any(axis=-1).sum(),
    }
    vector = jnp.stack([jnp.asarray(values[name], jnp.float32) for name in METRIC_NAMES])
    return loss, vector


def merge_metric_vectors(a: Array, b: Array) -> Array:
    """Two micro-batches' metric vectors combined by :func:`merge_loss_metrics`' rules."""
    combine = {"sum": jnp.add, "min": jnp.minimum, "max": jnp.maximum}
    return jnp.stack([combine[rule](a[i], b[i]) for i, rule in enumerate(_MERGE_RULES)])


def initial_metric_vector() -> Array:
    """The identity of :func:`merge_metric_vectors` (0 for sums, ±inf for extrema)."""
    return jnp.asarray(
        [{"sum": 0.0, "min": jnp.inf, "max": -jnp.inf}[rule] for rule in _MERGE_RULES],
        jnp.float32,
    )


def loss_metrics(vector: object) -> LossMetrics:
    """The host-side :class:`LossMetrics` of a metric vector (one device→host transfer)."""
    values = [float(v) for v in jax.device_get(vector)]
    return LossMetrics(**dict(zip(METRIC_NAMES, values, strict=True)))
