"""A tokenizer without the model: what scorers and the dispatcher load.

A ``tiny://`` recipe's tokenizer is built here without building the recipe's model, and without
importing torch or transformers' model code (seconds of a scorer's start-up). Any other name
goes through ``AutoTokenizer``, as the trainer and the engines load it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dockyard.models.names import tiny_recipe_name
from dockyard.models.tokenizers import (
    DEFAULT_CORPUS,
    build_calculator_tokenizer,
    build_character_tokenizer,
    train_bpe_tokenizer,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

#: The tokenizer of each text ``tiny://`` recipe, as :data:`dockyard.models.tiny.TINY_RECIPES`
#: builds it (tests/unit/models/test_tokenizer_loading.py holds the two together). The
#: vision-language recipe is not here: its tokenizer comes with its processor and model.
TINY_TOKENIZERS: dict[str, Callable[[], PreTrainedTokenizerFast]] = {
    "qwen2-arithmetic": build_character_tokenizer,
    "qwen2-calculator": build_calculator_tokenizer,
    "qwen2-bpe": lambda: train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="qwen2"),
    "qwen3-moe-arithmetic": build_character_tokenizer,
    "qwen3-moe-bpe": lambda: train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="qwen2"),
    "llama-bpe": lambda: train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="gpt2"),
}


def load_tokenizer(model_name: str, tokenizer_name: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer alone (scorers and the dispatcher need no weights)."""
    name = tokenizer_name or model_name
    recipe = tiny_recipe_name(name)
    if recipe is not None:
        build = TINY_TOKENIZERS.get(recipe)
        if build is not None:
            return build()
        from dockyard.models.tiny import build_tiny_recipe

        return build_tiny_recipe(recipe)[1]
    # AutoTokenizer picks the class from the model's config as well as the tokenizer's (a
    # directory declaring the generic backend may still load as the family's class), and that
    # choice imports torch; a scorer must decode exactly as the engines and the trainer do.
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(name)
    return tokenizer
