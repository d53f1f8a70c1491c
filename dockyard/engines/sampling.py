"""Sampling parameters: validation (shared with launch-time config checks) and the
processed distribution (temperature → top-k → top-p, vLLM's order) used by the torch engine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from dockyard.config.sections.policy import GenerationConfig, sampling_parameter_issues
from dockyard.engines.base import InvalidSamplingParams, SamplingParams

if TYPE_CHECKING:
    import torch


def make_sampling_params(
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    stop_token_ids: Iterable[int] = (),
    stop_strings: Iterable[str] = (),
    ignore_eos: bool = False,
    seed: int | None = None,
    path_prefix: str = "",
) -> SamplingParams:
    """Validated :class:`SamplingParams`; raises :class:`InvalidSamplingParams` listing every
    problem with its key path, so a NaN/inf/out-of-range value never reaches an engine."""
    issues = [str(issue) for issue in sampling_parameter_issues(temperature, top_p, top_k)]
    if max_new_tokens < 1:
        issues.append(f"max_new_tokens: must be >= 1, got {max_new_tokens}")
    stop_ids = tuple(int(token) for token in stop_token_ids)
    if any(token < 0 for token in stop_ids):
        issues.append(f"stop_token_ids: token ids must be >= 0, got {list(stop_ids)}")
    stops = tuple(stop_strings)
    if any(not stop for stop in stops):
        issues.append("stop_strings: an empty stop string would stop every sample at once")
    if issues:
        prefixed = [f"{path_prefix}{issue}" for issue in issues]
        raise InvalidSamplingParams("invalid sampling parameters: " + "; ".join(prefixed))
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=None if top_k in (None, -1) else int(top_k),
        stop_token_ids=stop_ids,
        stop_strings=stops,
        ignore_eos=ignore_eos,
        seed=seed,
    )


def sampling_params_from_config(generation: GenerationConfig) -> SamplingParams:
    """What a rollout worker calls at start-up. The config model already ran the same checks
    at launch; running them again here protects a worker built from an unvalidated
    (``model_construct``) or mutated config."""
    return make_sampling_params(
        max_new_tokens=generation.max_new_tokens,
        temperature=generation.temperature,
        top_p=generation.top_p,
        top_k=generation.top_k,
        stop_token_ids=generation.stop_token_ids or (),
        stop_strings=generation.stop_strings or (),
        ignore_eos=generation.ignore_eos,
        seed=generation.seed,
        path_prefix="policy.generation.",
    )


def processed_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities of the distribution actually sampled, shape like ``logits``
    (``[batch, vocab]``): temperature, then top-k, then top-p over the tempered softmax;
    removed tokens get ``-inf`` and the rest renormalise. Greedy returns a point mass
    (0.0 at the arg-max, ``-inf`` elsewhere)."""
    import torch

    logits = logits.float()
    if params.greedy:
        point = torch.full_like(logits, float("-inf"))
        return point.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 0.0)
    scaled = logits / params.temperature
    vocab = scaled.shape[-1]
    if params.top_k is not None and params.top_k < vocab:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # Probability mass strictly before each token; a token is kept while that mass is
        # below top_p, so the most likely token is always kept.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        remove_sorted = mass_before >= params.top_p
        remove = torch.zeros_like(remove_sorted).scatter_(-1, order, remove_sorted)
        scaled = scaled.masked_fill(remove, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)
