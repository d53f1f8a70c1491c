"""A tiny recipe's tokenizer, built without its model, is the one the recipe's model uses.

A scorer loads its tokenizer through :func:`dockyard.models.load_tokenizer`, which for a tiny
recipe imports no torch; these tests hold it to the tokenizer the trainer and engines use.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dockyard.models import load_tokenizer
from dockyard.models.names import TINY_VISION_RECIPES, is_vision_model
from dockyard.models.tiny import TINY_RECIPES, build_tiny_recipe
from dockyard.models.tokenizer_loading import TINY_TOKENIZERS

TEXTS = ["12+30=", "Hello, world! 3*4=12", "<bos>7+8=15<eos>", "ünïcode  spaces\n"]


def assert_same_tokenizer(ours, reference) -> None:
    assert type(ours) is type(reference)
    assert ours.get_vocab() == reference.get_vocab()
    assert ours.all_special_tokens == reference.all_special_tokens
    assert ours.chat_template == reference.chat_template
    assert ours.padding_side == reference.padding_side
    for text in TEXTS:
        ids = reference(text)["input_ids"]
        assert ours(text)["input_ids"] == ids
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(
            ids, skip_special_tokens=True
        )


@pytest.mark.parametrize("recipe", sorted(TINY_TOKENIZERS))
def test_a_tiny_recipe_tokenizer_is_the_one_its_model_is_built_with(recipe):
    assert recipe in TINY_RECIPES
    assert_same_tokenizer(load_tokenizer(f"tiny://{recipe}"), build_tiny_recipe(recipe)[1])


def test_every_text_recipe_has_a_tokenizer_built_without_its_model():
    text_recipes = {name for name, recipe in TINY_RECIPES.items() if recipe.processor is None}
    assert text_recipes == set(TINY_TOKENIZERS)


def test_the_vision_recipes_are_named_without_building_them():
    vision = {name for name, recipe in TINY_RECIPES.items() if recipe.processor is not None}
    assert vision == TINY_VISION_RECIPES
    assert all(is_vision_model(f"tiny://{name}") for name in vision)
    assert not any(is_vision_model(f"tiny://{name}") for name in TINY_TOKENIZERS)


@pytest.mark.slow  # a fresh interpreter importing transformers' tokenizer code
def test_loading_a_tiny_recipe_tokenizer_imports_no_torch():
    probe = (
        "import sys\n"
        "from dockyard.models import load_tokenizer\n"
        "load_tokenizer('tiny://qwen2-arithmetic')\n"
        "load_tokenizer('tiny://qwen2-bpe')\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"


def test_an_unknown_tiny_recipe_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown tiny model tiny://nosuch; known: tiny://"):
        load_tokenizer("tiny://nosuch")


def test_the_package_resolves_its_lazy_names_and_refuses_others():
    import dockyard.models as models

    assert sorted(models.__all__) == sorted(models._MODULE_OF)
    assert all(callable(getattr(models, name)) or name == "TINY_RECIPES" for name in models.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        _ = models.nosuch
    assert Path(models.__file__).name == "__init__.py"
