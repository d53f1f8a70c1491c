"""The torch engine generates with images for a vision-language policy: placeholders expanded
as the processor expands them, pixel values and Qwen2-VL's M-RoPE positions in the prefill, and
each sampled token's log-prob that of the model that saw the image — checked against one direct
Hugging Face forward over the prompt, the image and the generated tokens."""

from __future__ import annotations

import asyncio

import pytest
import torch
from PIL import Image

from dockyard.engines.base import EngineError, GenerationRequest, SamplingParams
from dockyard.engines.torch_engine import TorchEngine

RECIPE = "tiny://qwen2-vl-bpe"


@pytest.fixture(scope="module")
def engine() -> TorchEngine:
    return TorchEngine.from_pretrained(RECIPE)


def square(colour: tuple[int, int, int], size: tuple[int, int]) -> Image.Image:
    image = Image.new("RGB", size, (255, 255, 255))
    image.paste(colour, (size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4))
    return image


def chat_ids(engine: TorchEngine, images: int, text: str) -> list[int]:
    tokenizer = engine._tokenizer
    content = [{"type": "image"}] * images + [{"type": "text", "text": text}]
    rendered = tokenizer.apply_chat_template(  # type: ignore[union-attr]
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]  # type: ignore[misc]


def direct_logprobs(engine: TorchEngine, ids: list[int], images, generated: int) -> torch.Tensor:
    """log p of the last ``generated`` tokens of ``ids`` from one HF forward, with the images."""
    model = engine.model
    input_ids = torch.tensor([ids])
    kwargs = {}
    if images:
        vision = engine._processor.image_processor(images=images, return_tensors="pt")
        kwargs = {
            "pixel_values": vision["pixel_values"],
            "image_grid_thw": vision["image_grid_thw"],
            "mm_token_type_ids": (input_ids == model.config.image_token_id).int(),
        }
    with torch.no_grad():
        logits = model(input_ids=input_ids, **kwargs).logits[0].float()
    # A policy never samples an image: the engine gives the placeholder and vision start/end
    # tokens -inf before sampling, so its log-probs are those of the distribution without them.
    processor = engine._processor
    never = [
        processor.image_token_id,
        processor.vision_start_token_id,
        processor.vision_end_token_id,
    ]
    logits[:, never] = float("-inf")
    logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(-1, input_ids[0, 1:, None])[:, 0]
    return logprobs[-generated:]


def test_a_vlm_engine_accepts_images_and_a_text_one_does_not(engine):
    assert engine.accepts_images
    assert not TorchEngine.from_pretrained("tiny://qwen2-bpe").accepts_images


def test_generation_with_images_matches_a_direct_forward_and_reports_expanded_ids(engine):
    red, blue = square((220, 20, 20), (100, 60)), square((20, 20, 220), (56, 56))
    requests = [
        GenerationRequest(chat_ids(engine, 1, "which colour?"), "one-image", [red]),
        GenerationRequest(chat_ids(engine, 0, "a longer question without an image"), "text"),
        GenerationRequest(chat_ids(engine, 2, "and these?"), "two-images", [red, blue]),
    ]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    results = asyncio.run(engine.generate(requests, params, num_samples=2))
    pad = engine._processor.image_token_id
    for result in results:
        request = requests[result.request_index]
        if request.images:
            # 100x60 → 4x8 patches of 14 → 8 merged tokens; 56x56 → 4 (grid / 2²).
            expected_runs = {1: [8], 2: [8, 4]}[len(request.images)]
            prompt = result.prompt_token_ids.tolist()
            assert prompt.count(pad) == sum(expected_runs)
            assert [t for t in prompt if t != pad] == [
                t for t in request.prompt_token_ids if t != pad
            ]
        else:
            assert result.prompt_token_ids is None
            prompt = list(request.prompt_token_ids)
        generated = result.token_ids.tolist()
        expected = direct_logprobs(engine, prompt + generated, request.images, len(generated))
        torch.testing.assert_close(torch.from_numpy(result.logprobs), expected, rtol=0, atol=1e-4)


def test_the_image_changes_what_the_model_predicts(engine):
    prompt = chat_ids(engine, 1, "which colour?")
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=0)
    [result] = asyncio.run(
        engine.generate(
            [GenerationRequest(prompt, "r", [square((0, 200, 0), (80, 80))])], params, 1
        )
    )
    ids = result.prompt_token_ids.tolist() + result.token_ids.tolist()
    blind = direct_logprobs(engine, ids, [], len(result.token_ids))
    assert (torch.from_numpy(result.logprobs) - blind).abs().max() > 1e-3


def test_placeholders_that_disagree_with_the_images_are_refused(engine):
    prompt = chat_ids(engine, 2, "two placeholders")
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(EngineError, match=r"placeholder runs \[1, 1\] do not match .*\[4\]"):
        asyncio.run(
            engine.generate(
                [GenerationRequest(prompt, "r", [square((0, 0, 0), (56, 56))])], params, 1
            )
        )
