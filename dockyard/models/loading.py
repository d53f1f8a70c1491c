"""Resolve a ``policy.model_name`` to a model and tokenizer.

A name is either ``tiny://RECIPE`` (built in code from a seed, see :mod:`dockyard.models.tiny`)
or anything ``transformers`` loads (a local Hugging Face directory, usually). Engines that need a
directory on disk (vLLM, SGLang) call :func:`materialize_model_dir`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PreTrainedModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from dockyard.models.names import is_vision_model_dir, tiny_recipe_name
from dockyard.models.tiny import (
    build_tiny_processor,
    build_tiny_recipe,
    save_policy,
)
from dockyard.models.tokenizer_loading import load_tokenizer
from dockyard.models.vision import VisionProcessor
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

PRECISION_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def precision_dtype(precision: str) -> torch.dtype:
    try:
        return PRECISION_DTYPES[precision]
    except KeyError:
        known = ", ".join(PRECISION_DTYPES)
        raise ValueError(f"unknown precision {precision!r}; expected one of {known}") from None


def load_policy(
    model_name: str, precision: str = "float32", *, tokenizer_name: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` for ``model_name`` in ``precision``, model in eval mode.

    Use ``model.train()`` in a trainer. ``tokenizer_name`` overrides where the tokenizer comes
    from (``policy.tokenizer.name``).
    """
    dtype = precision_dtype(precision)
    recipe = tiny_recipe_name(model_name)
    if recipe is not None:
        tokenizer: PreTrainedTokenizerBase
        model, tokenizer = build_tiny_recipe(recipe, dtype)
        if tokenizer_name is not None:
            tokenizer = load_tokenizer(tokenizer_name)
    else:
        # A vision-language directory loads as the whole model (vision tower included), not
        # just its language model.
        if is_vision_model_dir(model_name):
            model = AutoModelForImageTextToText.from_pretrained(model_name, dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_name, dtype=dtype)
        tokenizer = load_tokenizer(model_name, tokenizer_name)
    log.info(
        "policy_loaded",
        model_name=model_name,
        precision=precision,
        parameters=sum(p.numel() for p in model.parameters()),
    )
    return model.eval(), tokenizer  # type: ignore[no-untyped-call]  # unannotated in transformers


def load_processor(model_name: str) -> VisionProcessor | None:
    """The image processor + tokenizer of a vision-language model; None for a text model."""
    recipe = tiny_recipe_name(model_name)
    if recipe is not None:
        return build_tiny_processor(recipe, build_tiny_recipe(recipe)[1])
    if not is_vision_model_dir(model_name):
        return None
    return VisionProcessor.from_pretrained(model_name)


def materialize_model_dir(model_name: str, cache_dir: str | Path) -> Path:
    """A Hugging Face directory for ``model_name``: the directory itself for a local path,
    or a ``tiny://`` recipe written once under ``cache_dir`` (reused when already complete)."""
    recipe = tiny_recipe_name(model_name)
    if recipe is None:
        path = Path(model_name)
        if not path.is_dir():
            raise FileNotFoundError(f"model {model_name!r} is not a local directory")
        return path
    key = hashlib.sha256(model_name.encode()).hexdigest()[:12]
    out = Path(cache_dir) / f"tiny-{recipe}-{key}"
    if out.is_dir():
        return out
    # Build beside the target and rename into place, so a concurrent process never reads a
    # half-written directory; the loser of a rename race keeps the winner's identical copy.
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    model, tokenizer = build_tiny_recipe(recipe)
    save_policy(model, tokenizer, staging, processor=build_tiny_processor(recipe, tokenizer))
    try:
        staging.rename(out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return out
