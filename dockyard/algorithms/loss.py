"""The clipped policy-gradient loss (PPO / GRPO / GSPO / REINFORCE / CISPO) with IS correction.

Which log-probs play which role (all per sampled token, ``[B, T]``):

- ``logprobs`` — π_θ, the policy being trained; the only input with a gradient.
- ``prev_logprobs`` — **π_old**: recomputed by the trainer with the weights at the start of the
  optimizer step, before any update. The PPO ratio is ``r = exp(lp − prev)``.
- ``generation_logprobs`` — the behaviour policy: what the inference engine reported when it
  sampled the token (after temperature, i.e. vLLM's ``processed_logprobs``), possibly from an
  older weight version. It enters only the off-policy weight ``w = exp(prev − gen)`` and the
  diagnostics.
- ``reference_logprobs`` — the frozen reference model, for the KL penalty.

The quantity minimised, per valid token (``mask = token_mask × sample_mask``)::

    L_actor = w · max(−A·r, −A·clamp(r, 1−ε_low, 1+ε_high))     (PPO / GRPO)
    L_actor = w · min(that, −A·c)      where A < 0                (dual clip, ratio_clip_c = c)
    L_actor = w · (−A · lp)                                       (disable_ppo_ratio: REINFORCE)
    L_actor = w · (−A · sg(clamp(r)) · lp)                        (use_cispo)
    L = reduce(L_actor) + β · reduce(KL) + μ · NLL(positive samples)

The NLL term is always a *token* mean over the positive samples' tokens (VAPO's definition, and
what the reference systems compute), whatever ``token_level_loss`` says: it is a supervised
language-model term, and a per-sequence mean would weight each token of a short positive answer
more than each token of a long one — a length bias the term has no reason to carry.

GSPO (``sequence_level_importance_ratios``) replaces ``r`` by the per-sequence
``exp(mean_t(lp − prev))``. Every ratio and IS weight takes ``exp`` of its log-ratio clamped to
±20 (:mod:`dockyard.algorithms.ratios`): a float32 ``exp`` overflows past ≈ 88.7, and backward
through an infinite ratio makes a NaN gradient even where the token is clipped.
``force_on_policy_ratio`` sets π_old := sg(π_θ), so ``r ≡ 1`` with the policy gradient intact
(and the IS weight becomes ``exp(sg(lp) − gen)``).

Reduction is token level (``Σ / global valid tokens``) or sequence level (per-sequence mean,
then ``Σ / global valid sequences``). Both divide by counts of the *whole* batch
(:class:`GlobalCounts`), so the micro-batch losses of one step sum to the full-batch loss exactly.

Everything is vectorised: no Python loop runs over tokens or samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dockyard.algorithms.importance import ImportanceWeights, importance_weights
from dockyard.algorithms.kl import kl_estimate, reference_kl
from dockyard.algorithms.loss_metrics import LossMetrics
from dockyard.algorithms.masked import (
    masked_max,
    masked_min,
    masked_sum,
    per_sequence_mean,
    sequence_level_reduce,
    token_level_reduce,
    zero_where_masked,
)
from dockyard.algorithms.ratios import bounded_exp, bounded_weight
from dockyard.config.sections.loss import ClippedPGLossConfig

# Tolerance when checking that a micro-batch's counts fit inside the declared global counts.
_COUNT_SLACK = 1e-6


@dataclass(frozen=True)
class GlobalCounts:
    """Counts over the *whole* batch of a step (every micro-batch, every data-parallel rank).

    ``positive_tokens`` counts the tokens of samples with reward > 0; it normalises the
    positive-example NLL term and is needed only when ``positive_example_nll_weight > 0``.
    """

    valid_tokens: float
    valid_sequences: float
    positive_tokens: float = 0.0

    @classmethod
    def from_batch(
        cls,
        token_mask: torch.Tensor,
        sample_mask: torch.Tensor,
        rewards: torch.Tensor | None = None,
    ) -> GlobalCounts:
        """Count a full batch (call it before splitting into micro-batches)."""
        mask = token_mask.bool() & sample_mask.bool().unsqueeze(-1)
        has_tokens = mask.any(dim=-1)
        positive = torch.zeros_like(has_tokens) if rewards is None else rewards.detach() > 0
        counts = torch.stack(
            [
                mask.sum(),
                has_tokens.sum(),
                (mask & positive.unsqueeze(-1)).sum(),
            ]
        ).tolist()
        return cls(*(float(c) for c in counts))


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch. Shapes: ``[B, T]`` per token, ``[B]`` per sample.

    ``advantages`` may be ``[B, T]`` or ``[B]`` (broadcast over tokens). ``reference_logprobs``
    is required when the reference KL enters the loss; ``rewards`` when the positive-example NLL
    term is on (a sample with reward > 0 is "positive").
    """

    logprobs: torch.Tensor
    prev_logprobs: torch.Tensor
    generation_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_mask: torch.Tensor
    sample_mask: torch.Tensor
    reference_logprobs: torch.Tensor | None = None
    rewards: torch.Tensor | None = None

    def check_shapes(self) -> None:
        shape = tuple(self.logprobs.shape)
        if len(shape) != 2:
            raise ValueError(f"logprobs must be [B, T], got shape {shape}")
        per_token = {
            "prev_logprobs": self.prev_logprobs,
            "generation_logprobs": self.generation_logprobs,
            "token_mask": self.token_mask,
            "reference_logprobs": self.reference_logprobs,
        }
        for name, tensor in per_token.items():
            if tensor is not None and tuple(tensor.shape) != shape:
                raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
        per_sample = {"sample_mask": self.sample_mask, "rewards": self.rewards}
        for name, tensor in per_sample.items():
            if tensor is not None and tuple(tensor.shape) != shape[:1]:
                raise ValueError(f"{name} must have shape {shape[:1]}, got {tuple(tensor.shape)}")
        if tuple(self.advantages.shape) not in (shape, shape[:1]):
            raise ValueError(
                f"advantages must have shape {shape} or {shape[:1]}, "
                f"got {tuple(self.advantages.shape)}"
            )


@dataclass(frozen=True)
class _Surrogate:
    per_token: torch.Tensor  # un-reduced actor loss, before the IS weight
    ratio: torch.Tensor  # the ratio the surrogate used (diagnostic, detached)
    ratio_clamped: torch.Tensor
    clipped: torch.Tensor  # bool: ratio outside the clip range
    dual_clipped: torch.Tensor  # bool: dual-clip bound taken


class ClippedPGLoss:
    """``loss, metrics = ClippedPGLoss(cfg)(inputs, counts)``; see the module docstring."""

    def __init__(self, cfg: ClippedPGLossConfig) -> None:
        self.cfg = cfg

    @property
    def token_level(self) -> bool:
        return self.cfg.token_level_loss

    @property
    def kl_in_loss(self) -> bool:
        return self.cfg.reference_policy_kl_penalty != 0 and not self.cfg.use_kl_in_reward

    def __call__(
        self, inputs: LossInputs, counts: GlobalCounts
    ) -> tuple[torch.Tensor, LossMetrics]:
        inputs.check_shapes()
        cfg = self.cfg
        if self.kl_in_loss and inputs.reference_logprobs is None:
            raise ValueError(
                "loss_fn.reference_policy_kl_penalty != 0 needs reference_logprobs "
                "(or set loss_fn.use_kl_in_reward=true / the penalty to 0)"
            )
        if cfg.positive_example_nll_weight > 0 and inputs.rewards is None:
            raise ValueError("loss_fn.positive_example_nll_weight > 0 needs per-sample rewards")

        dtype = torch.promote_types(inputs.logprobs.dtype, torch.float32)
        mask = inputs.token_mask.bool() & inputs.sample_mask.bool().unsqueeze(-1)
        # Zero every input at masked positions first: padding may hold -inf or NaN, and a NaN
        # anywhere in the graph turns masked gradients into NaN even under torch.where.
        lp = zero_where_masked(inputs.logprobs.to(dtype), mask)
        prev = self._detached(inputs.prev_logprobs, mask, dtype)
        gen = self._detached(inputs.generation_logprobs, mask, dtype)
        advantages = inputs.advantages.detach().to(dtype)
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(-1).expand_as(lp)
        advantages = zero_where_masked(advantages, mask)
        if cfg.force_on_policy_ratio:
            prev = lp.detach()

        surrogate = self._surrogate(lp, prev, advantages, mask)
        weights = importance_weights(prev, gen, mask, cfg)
        actor_loss = self._reduce(weights.weights * surrogate.per_token, mask, counts)

        kl_term = torch.zeros((), dtype=dtype, device=lp.device)
        if inputs.reference_logprobs is not None:
            ref = self._detached(inputs.reference_logprobs, mask, dtype)
            kl_per_token = reference_kl(lp, ref, cfg)
            if cfg.use_on_policy_kl_approximation:
                # Tokens were sampled from π_gen, the KL is an expectation under π_θ: reweight
                # by π_θ/π_gen (detached), as the reference system does. Bounded like every
                # weight; a non-finite log-ratio drops the token.
                kl_per_token = bounded_weight(lp - gen).detach() * kl_per_token
            kl_term = self._reduce(kl_per_token, mask, counts)
        kl_loss = (
            cfg.reference_policy_kl_penalty * kl_term
            if self.kl_in_loss
            else torch.zeros_like(kl_term)
        )

        nll = self._positive_nll(lp, mask, inputs.rewards, counts)
        loss = actor_loss + kl_loss + cfg.positive_example_nll_weight * nll

        metrics = self._metrics(
            loss, actor_loss, kl_loss, kl_term, nll, lp, prev, gen, mask, surrogate, weights, counts
        )
        return loss, metrics

    # ---- pieces -------------------------------------------------------------------------------

    @staticmethod
    def _detached(tensor: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return zero_where_masked(tensor.detach().to(dtype), mask)

    def _reduce(
        self, values: torch.Tensor, mask: torch.Tensor, counts: GlobalCounts
    ) -> torch.Tensor:
        values = values.expand_as(mask) if values.shape != mask.shape else values
        if self.token_level:
            return token_level_reduce(values, mask, counts.valid_tokens)
        return sequence_level_reduce(values, mask, counts.valid_sequences)

    def _surrogate(
        self, lp: torch.Tensor, prev: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> _Surrogate:
        cfg = self.cfg
        low, high = 1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max
        no_clip = torch.zeros_like(mask)
        if cfg.force_on_policy_ratio:
            ratio = torch.exp(lp - lp.detach())  # ≡ 1, gradient = ∇lp
            ratio_clamped, clipped = ratio, no_clip
        elif cfg.sequence_level_importance_ratios:
            seq_ratio = bounded_exp(per_sequence_mean(lp - prev, mask)).unsqueeze(-1)
            ratio = seq_ratio.expand_as(lp)
            ratio_clamped = ratio.clamp(low, high)
            clipped = (ratio.detach() < low) | (ratio.detach() > high)
        else:
            ratio = bounded_exp(lp - prev)
            ratio_clamped = ratio.clamp(low, high)
            clipped = (ratio.detach() < low) | (ratio.detach() > high)

        if cfg.disable_ppo_ratio:
            per_token = -advantages * lp
            ratio_clamped, clipped = ratio, no_clip
        elif cfg.use_cispo:
            per_token = -advantages * ratio_clamped.detach() * lp
        else:
            per_token = torch.maximum(-advantages * ratio, -advantages * ratio_clamped)

        dual_clipped = no_clip
        if cfg.ratio_clip_c is not None:
            bound = -advantages * cfg.ratio_clip_c
            dual_clipped = (advantages < 0) & (per_token.detach() > bound)
            per_token = torch.where(dual_clipped, bound, per_token)
        return _Surrogate(
            per_token=per_token,
            ratio=ratio.detach(),
            ratio_clamped=ratio_clamped.detach(),
            clipped=clipped & mask,
            dual_clipped=dual_clipped & mask,
        )

    def _positive_nll(
        self,
        lp: torch.Tensor,
        mask: torch.Tensor,
        rewards: torch.Tensor | None,
        counts: GlobalCounts,
    ) -> torch.Tensor:
        """VAPO's positive-example NLL: the token mean of ``−lp`` over samples with reward > 0
        (token mean at either loss level: see the module docstring), normalised by the global
        positive token count so that accumulation stays exact (the reference divides by the
        micro-batch's own count, which is not)."""
        if self.cfg.positive_example_nll_weight == 0 or rewards is None:
            return torch.zeros((), dtype=lp.dtype, device=lp.device)
        positive_mask = mask & (rewards.detach() > 0).unsqueeze(-1)
        return token_level_reduce(-lp, positive_mask, counts.positive_tokens)

    def _metrics(
        self,
        loss: torch.Tensor,
        actor_loss: torch.Tensor,
        kl_loss: torch.Tensor,
        kl_term: torch.Tensor,
        nll: torch.Tensor,
        lp: torch.Tensor,
        prev: torch.Tensor,
        gen: torch.Tensor,
        mask: torch.Tensor,
        surrogate: _Surrogate,
        weights: ImportanceWeights,
        counts: GlobalCounts,
    ) -> LossMetrics:
        with torch.no_grad():
            lp = lp.detach()
            n_tok = max(counts.valid_tokens, 1.0)
            n_seq = max(counts.valid_sequences, 1.0)
            is_norm = n_seq if weights.per_sequence else n_tok
            trunc_norm = n_seq if weights.truncation_per_sequence else n_tok

            def token_mean(values: torch.Tensor) -> torch.Tensor:
                return masked_sum(values, mask) / n_tok

            raw = weights.raw.expand_as(weights.raw_mask)
            scalars = [
                loss.detach(),
                actor_loss.detach(),
                kl_loss.detach(),
                kl_term.detach(),
                nll.detach(),
                token_mean(surrogate.ratio),
                masked_min(surrogate.ratio, mask),
                masked_max(surrogate.ratio, mask),
                token_mean(surrogate.ratio_clamped),
                surrogate.clipped.to(lp.dtype).sum() / n_tok,
                surrogate.dual_clipped.to(lp.dtype).sum() / n_tok,
                masked_sum(raw, weights.raw_mask) / is_norm,
                masked_min(raw, weights.raw_mask),
                masked_max(raw, weights.raw_mask),
                weights.truncated.to(lp.dtype).sum() / trunc_norm,
                token_mean(torch.exp((gen - prev).abs())),
                token_mean(kl_estimate(gen, prev, "k3")),
                token_mean(kl_estimate(prev, gen, "k3")),
                -token_mean(torch.exp(lp - gen) * lp),
                mask.sum(),
                mask.any(dim=-1).sum(),
            ]
            # One device→host transfer for all metrics, not one sync per scalar.
            values = torch.stack([s.to(torch.float64) for s in scalars]).tolist()
            metrics = LossMetrics(*values)
        if metrics.num_valid_tokens > counts.valid_tokens + _COUNT_SLACK:
            raise ValueError(
                f"this micro-batch has {metrics.num_valid_tokens:.0f} valid tokens but the global "
                f"count is {counts.valid_tokens:.0f}: count the whole batch "
                "(GlobalCounts.from_batch)"
            )
        if metrics.num_valid_samples > counts.valid_sequences + _COUNT_SLACK:
            raise ValueError(
                f"this micro-batch has {metrics.num_valid_samples:.0f} valid sequences but the "
                f"global count is {counts.valid_sequences:.0f}: count the whole batch"
            )
        return metrics
