"""Policy model and tokenizer construction: ``tiny://`` recipes built in code, or HF directories."""

from dockyard.models.loading import (
    load_policy,
    load_processor,
    load_tokenizer,
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
from dockyard.models.tokenizers import build_character_tokenizer, train_bpe_tokenizer

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
