"""The placeholder contract: expanded runs sized by the image processor's grid, pixel inputs in
image order, and single placeholders expanded once."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

from dockyard.models import load_policy, load_processor
from dockyard.models.vision import (
    check_expanded,
    expand_placeholders,
    expanded_placeholder_ids,
    forward_kwargs,
    pixel_inputs,
    placeholder_runs,
)

RECIPE = "tiny://qwen2-vl-bpe"


@pytest.fixture(scope="module")
def processor():
    loaded = load_processor(RECIPE)
    assert loaded is not None
    return loaded


def _qwen2_vl_tokens(width: int, height: int, min_tokens: int, max_tokens: int) -> int:
    """Qwen2-VL's smart_resize, written from its definition: each side rounded to a multiple
    of 28, then scaled (keeping the aspect) into [min, max] merged 28x28 tokens."""
    h, w = round(height / 28) * 28, round(width / 28) * 28
    if h * w > max_tokens * 784:
        beta = math.sqrt(height * width / (max_tokens * 784))
        h, w = math.floor(height / beta / 28) * 28, math.floor(width / beta / 28) * 28
    elif h * w < min_tokens * 784:
        beta = math.sqrt(min_tokens * 784 / (height * width))
        h, w = math.ceil(height * beta / 28) * 28, math.ceil(width * beta / 28) * 28
    return (h // 28) * (w // 28)


@pytest.mark.parametrize("size", [(100, 60), (640, 480), (20, 20), (56, 56)])
def test_an_image_expands_to_one_placeholder_per_merged_patch(processor, size):
    image = Image.new("RGB", size, (0, 128, 255))
    [run] = expanded_placeholder_ids(processor, [image])
    assert run == [processor.image_token_id] * _qwen2_vl_tokens(*size, 4, 16)


def test_pixel_inputs_hold_one_grid_row_per_image_in_order(processor):
    small, large = Image.new("RGB", (56, 56)), Image.new("RGB", (640, 480))
    inputs = pixel_inputs(processor, [small, large])
    assert inputs.image_grid_thw.tolist() == [[1, 4, 4], [1, 6, 8]]
    # 2x14x14 patches of 3 channels (temporal pair), one row per patch.
    assert inputs.pixel_values.shape == (16 + 48, 3 * 2 * 14 * 14)


def test_expanding_single_placeholders_gives_the_ids_the_model_attends_to(processor):
    tokenizer = processor.tokenizer
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}]},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text + "<|vision_start|><|image_pad|><|vision_end|>")["input_ids"]
    images = [Image.new("RGB", (100, 60)), Image.new("RGB", (56, 56))]
    expanded = expand_placeholders(processor, ids, images)
    runs = placeholder_runs(expanded, processor.image_token_id)
    assert [length for _, length in runs] == [8, 4]
    pad = processor.image_token_id
    assert [t for t in expanded if t != pad] == [t for t in ids if t != pad]
    check_expanded(processor, expanded, pixel_inputs(processor, images).image_grid_thw)
    # A Qwen2-VL forward accepts exactly these ids with these pixels (it checks the counts).
    model, _ = load_policy(RECIPE)
    vision = pixel_inputs(processor, images)
    input_ids = torch.tensor([expanded])
    with torch.no_grad():
        logits = model(input_ids=input_ids, **forward_kwargs(processor, input_ids, vision)).logits
    assert logits.shape[1] == len(expanded)


def test_mismatched_or_already_expanded_placeholders_are_refused(processor):
    pad = processor.image_token_id
    image = Image.new("RGB", (56, 56))
    with pytest.raises(ValueError, match="1 image placeholder"):
        expand_placeholders(processor, [5, pad, 6], [image, image])
    with pytest.raises(ValueError, match="already-expanded"):
        expand_placeholders(processor, [5, pad, pad, 6], [image])
    with pytest.raises(ValueError, match="do not match"):
        check_expanded(processor, [pad] * 3, pixel_inputs(processor, [image]).image_grid_thw)


def test_placeholder_runs_are_maximal_and_ordered():
    assert placeholder_runs([9, 9, 1, 9, 2, 9, 9, 9], 9) == [(0, 2), (3, 1), (5, 3)]
    assert placeholder_runs([], 9) == []
