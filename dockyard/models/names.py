"""What a ``policy.model_name`` names, told without loading it (and without importing torch).

A name is a ``tiny://`` recipe built in code (:mod:`dockyard.models.tiny`) or a Hugging Face
directory; either may be a vision-language model. Launch-time checks and scorers ask these
questions before, or instead of, building anything.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_SCHEME = "tiny://"
#: The ``tiny://`` recipes that are vision-language models (tests/unit/models/
#: test_tokenizer_loading.py holds this to :data:`dockyard.models.tiny.TINY_RECIPES`).
TINY_VISION_RECIPES = frozenset({"qwen2-vl-bpe"})
#: ``config.model_type`` values whose placeholders follow :mod:`dockyard.models.vision`'s contract.
VISION_MODEL_TYPES = ("qwen2_vl",)


def tiny_recipe_name(model_name: str) -> str | None:
    """``"qwen2-arithmetic"`` for ``"tiny://qwen2-arithmetic"``; None for any other name."""
    if not model_name.startswith(TINY_SCHEME):
        return None
    return model_name[len(TINY_SCHEME) :]


def is_vision_model_dir(model_dir: str | Path) -> bool:
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return False
    return bool(json.loads(config.read_text()).get("model_type") in VISION_MODEL_TYPES)


def is_vision_model(model_name: str) -> bool:
    """Whether ``model_name`` is a vision-language policy, without loading its weights."""
    recipe = tiny_recipe_name(model_name)
    if recipe is not None:
        return recipe in TINY_VISION_RECIPES
    return is_vision_model_dir(model_name)
