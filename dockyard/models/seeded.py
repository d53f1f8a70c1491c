"""Building a tiny model from a seed, the same way for every recipe (text or vision-language)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase


def seeded_model(
    make: Callable[[PretrainedConfig], PreTrainedModel],
    config: PretrainedConfig,
    *,
    seed: int,
    tokenizer: PreTrainedTokenizerBase,
    dtype: torch.dtype,
) -> PreTrainedModel:
    """``make(config)`` initialised from ``seed`` (the global RNG forked, so building a model
    never perturbs a caller's random stream), generating with ``tokenizer``'s special ids, in
    ``dtype`` and eval mode. Every process that builds it gets bit-identical weights."""
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = make(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    # Module.to and .eval change the model in place and return it.
    model.to(dtype)  # type: ignore[arg-type]  # functools.wraps on transformers' .to mistypes self
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves eval() unannotated
    return model
