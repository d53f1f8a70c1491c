"""The trainer trains a vision-language policy's samples *with* their images: every forward pass
(π_old, reference, loss) gets the pixel values of its rows' images, so the log-probs are those of
the model that saw the images, gradients reach the vision tower, and a sample whose ids and
images disagree is refused instead of being scored against the wrong features."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch
from PIL import Image

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.batch import TrainingBatch, build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.models import load_policy, load_processor
from tests.unit.trainer.test_batch_and_step import scored_group

RECIPE = "tiny://qwen2-vl-bpe"
MERGE = 2  # Qwen2-VL's spatial merge: 2x2 patches of 14 pixels become one placeholder


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def square(colour: tuple[int, int, int], size: tuple[int, int]) -> Image.Image:
    image = Image.new("RGB", size, (255, 255, 255))
    image.paste(colour, (size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4))
    return image


@pytest.fixture(scope="module")
def policy():
    model, tokenizer = load_policy(RECIPE)
    processor = load_processor(RECIPE)
    assert processor is not None
    return model, tokenizer, processor


def prompt_ids(tokenizer, processor, images: list[Image.Image]) -> list[int]:
    """The prompt as Qwen2-VL's processor builds it: the chat template's text with each
    ``<|image_pad|>`` repeated once per merged patch of its image (grid t·h·w / merge²)."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "which colour?"}]
    messages = [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if images:
        grids = processor.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
        parts = text.split("<|image_pad|>")
        text = parts[0]
        for grid, rest in zip(grids, parts[1:], strict=True):
            text += "<|image_pad|>" * (int(grid.prod()) // MERGE**2) + rest
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def config(*overrides: str):
    # Temperature 1: the trainer scores under the sampling temperature, the direct forward
    # below under the model's own distribution.
    return load_config(
        "configs/quickstart.yaml",
        [
            f"policy.model_name={RECIPE}",
            "policy.train_micro_batch_size=2",
            "policy.generation.temperature=1.0",
            *overrides,
        ],
    )


def hf_response_logprobs(model, ids: list[int], response: int, vision) -> torch.Tensor:
    """log p(response token) from one direct forward of the HF model, float32."""
    input_ids = torch.tensor([ids])
    kwargs = {}
    if vision is not None:
        kwargs = {
            "pixel_values": vision["pixel_values"],
            "image_grid_thw": vision["image_grid_thw"],
            "mm_token_type_ids": (input_ids == model.config.image_token_id).int(),
        }
    with torch.no_grad():
        logits = model(input_ids=input_ids, **kwargs).logits.float()
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1)
    targets = torch.tensor(ids[1:])
    picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked[len(ids) - 1 - response :]


def on_policy(trainer: PolicyTrainer, batch: TrainingBatch) -> TrainingBatch:
    """``batch`` with behaviour log-probs the policy's own, as an engine sampling from it
    reports them (made-up ones would be masked by the quickstart's icepop truncation)."""
    own = trainer.batch_logprobs(trainer.model, batch) * batch.token_mask
    return dataclasses.replace(batch, generation_logprobs=own)


@pytest.mark.parametrize("count", [1, 2])
def test_log_probs_equal_a_direct_forward_on_the_processor_outputs(policy, count):
    model, tokenizer, processor = policy
    images = [square((220, 30, 30), (100, 60)), square((30, 30, 220), (56, 84))][:count]
    prompt = prompt_ids(tokenizer, processor, images)
    response = tokenizer("red<|im_end|>", add_special_tokens=False)["input_ids"]
    group = scored_group("g", prompt, [response], [1.0], [png(image) for image in images])
    trainer = PolicyTrainer(model, config(), torch.device("cpu"), processor=processor)
    batch = build_batch([group], tokenizer.pad_token_id)
    ours = trainer.batch_logprobs(trainer.model, batch)[0][batch.token_mask[0].bool()]

    vision = processor.image_processor(images=images, return_tensors="pt")
    expected = hf_response_logprobs(trainer.model.eval(), prompt + response, len(response), vision)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    # The same ids without the images (placeholders read as plain tokens) score differently:
    # what a trainer that drops the images computes.
    blind = hf_response_logprobs(trainer.model, prompt + response, len(response), None)
    assert (ours - blind).abs().max() > 1e-3


def test_gradients_reach_the_vision_tower_and_a_mixed_batch_steps(policy):
    model, tokenizer, processor = policy
    image = square((30, 200, 30), (80, 80))
    prompt = prompt_ids(tokenizer, processor, [image])
    text_prompt = prompt_ids(tokenizer, processor, [])
    answers = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("green", "blue")]
    groups = [
        scored_group("with-image", prompt, answers, [1.0, 0.0], [png(image)]),
        scored_group("text", text_prompt, answers, [0.0, 1.0], []),
    ]
    trainer = PolicyTrainer(model, config(), torch.device("cpu"), processor=processor)
    batch = on_policy(trainer, build_batch(groups, tokenizer.pad_token_id))
    assert batch.images == ((png(image),), (png(image),), (), ())
    visual = [p for name, p in trainer.model.named_parameters() if name.startswith("model.visual")]
    assert visual
    before = [p.detach().clone() for p in visual]
    outcome = trainer.step(batch)
    assert all(np.isfinite(value) for value in outcome.loss.as_dict().values())
    assert outcome.grad_norm > 0
    # The vision tower is trained by the image samples' loss: its weights moved.
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, visual, strict=True))


def test_the_vision_tower_gets_no_gradient_from_a_text_only_batch(policy):
    model, tokenizer, processor = policy
    text_prompt = prompt_ids(tokenizer, processor, [])
    answers = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("green", "blue")]
    trainer = PolicyTrainer(model, config(), torch.device("cpu"), processor=processor)
    batch = on_policy(
        trainer, build_batch([scored_group("t", text_prompt, answers, [0.0, 1.0], [])], 0)
    )
    assert batch.images is None
    trainer.gradients(batch)
    assert any(p.grad is not None and p.grad.any() for p in trainer.model.parameters())
    visual = [p for name, p in trainer.model.named_parameters() if name.startswith("model.visual")]
    assert all(p.grad is None or not p.grad.any() for p in visual)


def test_placeholders_that_disagree_with_the_images_are_refused(policy):
    model, tokenizer, processor = policy
    image = square((200, 30, 30), (100, 60))  # 8 placeholders
    prompt = prompt_ids(tokenizer, processor, [square((0, 0, 0), (56, 56))])  # 4 of them
    response = tokenizer("red", add_special_tokens=False)["input_ids"]
    group = scored_group("bad", prompt, [response], [1.0], [png(image)])
    trainer = PolicyTrainer(model, config(), torch.device("cpu"), processor=processor)
    with pytest.raises(ValueError, match=r"group 'bad'.*\[4\] do not match .*\[8\]"):
        trainer.batch_logprobs(trainer.model, build_batch([group], 0))


def test_images_without_an_image_processor_are_refused(policy):
    model, tokenizer, processor = policy
    image = square((200, 30, 30), (56, 56))
    prompt = prompt_ids(tokenizer, processor, [image])
    group = scored_group("g", prompt, [[5]], [1.0], [png(image)])
    trainer = PolicyTrainer(model, config(), torch.device("cpu"))
    with pytest.raises(ValueError, match="no image processor"):
        trainer.batch_logprobs(trainer.model, build_batch([group], 0))


def test_validation_refuses_image_prompts_it_would_answer_blind(policy):
    from dockyard.consumers.trainer.evaluation import Evaluator
    from dockyard.data.base import PromptRecord

    model, tokenizer, _ = policy
    records = [
        PromptRecord(index=0, prompt="text", ground_truth="a", env="hle"),
        PromptRecord(index=1, prompt="look", ground_truth="red", env="hle", images=(b"png",)),
    ]
    with pytest.raises(ValueError, match=r"validation records \[1\] carry images"):
        Evaluator(model, tokenizer, records, environment=None, max_new_tokens=2)


def test_the_reference_pass_sees_the_images_too(policy):
    model, tokenizer, processor = policy
    image = square((220, 30, 30), (100, 60))
    prompt = prompt_ids(tokenizer, processor, [image])
    response = tokenizer("red", add_special_tokens=False)["input_ids"]
    group = scored_group("g", prompt, [response], [1.0], [png(image)])
    kl = "loss_fn.reference_policy_kl_penalty=0.1"
    trainer = PolicyTrainer(model, config(kl), torch.device("cpu"), processor=processor)
    assert trainer.reference is not None
    batch = build_batch([group], tokenizer.pad_token_id)
    ours = trainer.batch_logprobs(trainer.reference, batch)[0][batch.token_mask[0].bool()]
    vision = processor.image_processor(images=[image], return_tensors="pt")
    ids = prompt + response
    torch.testing.assert_close(
        ours, hf_response_logprobs(trainer.reference, ids, len(response), vision), rtol=0, atol=1e-5
    )
