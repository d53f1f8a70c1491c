"""Policy model and tokenizer construction: ``tiny://`` recipes built in code, or HF directories.

The names below are imported on first use: a scorer that needs only :func:`load_tokenizer`
never imports torch or transformers' model code (dockyard/models/tokenizer_loading.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dockyard.models.loading import (
        load_policy,
        load_processor,
        materialize_model_dir,
        precision_dtype,
    )
    from dockyard.models.tiny import (
        TINY_RECIPES,
        TinyModelSpec,
        build_arithmetic_policy,
        build_bpe_policy,
        build_tiny_model,
        build_tiny_recipe,
        save_policy,
    )
    from dockyard.models.tokenizer_loading import load_tokenizer
    from dockyard.models.tokenizers import build_character_tokenizer, train_bpe_tokenizer

_MODULE_OF = {
    "load_policy": "loading",
    "load_processor": "loading",
    "materialize_model_dir": "loading",
    "precision_dtype": "loading",
    "TINY_RECIPES": "tiny",
    "TinyModelSpec": "tiny",
    "build_arithmetic_policy": "tiny",
    "build_bpe_policy": "tiny",
    "build_tiny_model": "tiny",
    "build_tiny_recipe": "tiny",
    "save_policy": "tiny",
    "load_tokenizer": "tokenizer_loading",
    "build_character_tokenizer": "tokenizers",
    "train_bpe_tokenizer": "tokenizers",
}

__all__ = [
    "TINY_RECIPES",
    "TinyModelSpec",
    "build_arithmetic_policy",
    "build_bpe_policy",
    "build_character_tokenizer",
    "build_tiny_model",
    "build_tiny_recipe",
    "load_policy",
    "load_processor",
    "load_tokenizer",
    "materialize_model_dir",
    "precision_dtype",
    "save_policy",
    "train_bpe_tokenizer",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
