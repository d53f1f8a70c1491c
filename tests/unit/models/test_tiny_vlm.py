"""``tiny://qwen2-vl-bpe``: a Qwen2-VL built in code with the family's tokens, chat template and
image processor, saved and loaded as a standard directory."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import Qwen2VLForConditionalGeneration

from dockyard.models import load_policy, load_processor, materialize_model_dir
from dockyard.models.tiny import build_tiny_recipe, save_policy
from dockyard.models.tiny_vlm import QWEN2_VL_SPECIAL_TOKENS

RECIPE = "tiny://qwen2-vl-bpe"


def test_the_tokenizer_carries_the_family_special_tokens_as_single_ids():
    _, tokenizer = build_tiny_recipe("qwen2-vl-bpe")
    for token in QWEN2_VL_SPECIAL_TOKENS:
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [
            tokenizer.convert_tokens_to_ids(token)
        ], token
    assert tokenizer.eos_token == "<|im_end|>"


def test_the_chat_template_writes_one_placeholder_per_image_part():
    _, tokenizer = build_tiny_recipe("qwen2-vl-bpe")
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "left, right:"},
                {"type": "image"},
            ],
        }
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # Qwen2-VL-Instruct's rendering: default system turn, image parts wrapped in vision markers.
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>left, right:"
        "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n"
    )


def test_head_dim_suits_vllm_cpu_and_the_vision_tower_feeds_the_text_width():
    model, _ = build_tiny_recipe("qwen2-vl-bpe")
    text = model.config.text_config
    assert text.hidden_size // text.num_attention_heads == 32
    assert model.config.vision_config.hidden_size == text.hidden_size
    # mrope splits the rotary half-dimension (16) into temporal/height/width sections.
    assert sum(text.rope_parameters["mrope_section"]) == 16


def test_a_saved_directory_loads_the_same_model_and_processor(tmp_path):
    model, tokenizer = build_tiny_recipe("qwen2-vl-bpe")
    processor = load_processor(RECIPE)
    assert processor is not None
    save_policy(model, tokenizer, tmp_path, processor=processor)
    preprocessor = json.loads((tmp_path / "preprocessor_config.json").read_text())
    # Qwen2-VL's pixel budget (transformers keeps min/max_pixels in ``size``): a merged token
    # covers 28x28 pixels, so 4 to 16 tokens per image.
    assert preprocessor["size"] == {"shortest_edge": 4 * 784, "longest_edge": 16 * 784}
    assert preprocessor["image_processor_type"] == "Qwen2VLImageProcessor"

    loaded_model, loaded_tokenizer = load_policy(str(tmp_path))
    loaded = load_processor(str(tmp_path))
    assert isinstance(loaded_model, Qwen2VLForConditionalGeneration)
    assert loaded is not None
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded_model.state_dict()[name], tensor, rtol=0, atol=0)
    text = "which colour is the square? <|vision_start|><|image_pad|><|vision_end|>"
    assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.tokenizer.chat_template == tokenizer.chat_template
    image = Image.new("RGB", (100, 60), (200, 10, 10))
    ours = processor.image_processor(images=[image], return_tensors="pt")
    theirs = loaded.image_processor(images=[image], return_tensors="pt")
    assert torch.equal(ours["pixel_values"], theirs["pixel_values"])
    assert torch.equal(ours["image_grid_thw"], theirs["image_grid_thw"])


def test_a_vlm_is_not_saved_without_its_processor(tmp_path):
    model, tokenizer = build_tiny_recipe("qwen2-vl-bpe")
    with pytest.raises(ValueError, match="processor"):
        save_policy(model, tokenizer, tmp_path)


def test_the_materialized_directory_holds_the_processor(tmp_path):
    out = materialize_model_dir(RECIPE, tmp_path)
    assert (out / "preprocessor_config.json").is_file()
    assert load_processor(str(out)) is not None


def test_a_text_model_has_no_processor():
    assert load_processor("tiny://qwen2-bpe") is None
