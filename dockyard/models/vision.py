"""The image ↔ token contract of a vision-language policy, shared by engines, episodes and the
trainer.

A Qwen2-VL prompt holds one ``<|image_pad|>`` per image as the chat template writes it
(``<|vision_start|><|image_pad|><|vision_end|>``); the model attends to that placeholder
*expanded*: one ``<|image_pad|>`` per merged patch, ``prod(image_grid_thw) / merge_size²`` of
them, each replaced by a vision-tower embedding. Every token sequence downstream of the engine
(rollouts on the wire, the trainer's batches) holds the placeholders expanded — exactly the ids
the model attended to — and its images in placeholder-run order, so a sample's images are
recovered from its ids and ``images`` without re-tokenising anything.

:class:`VisionProcessor` pairs the tokenizer with the family's image processor. It stands in
for ``transformers.Qwen2VLProcessor``, which transformers 5.19 cannot construct without
torchvision (its mandatory video sub-processor needs it, and PyPI's torchvision does not load
against the CPU build of torch used here); the directory it writes is the standard one
(``preprocessor_config.json`` + tokenizer files + ``chat_template.jinja``), so
``AutoProcessor`` reads it wherever torchvision is installed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from dockyard.models.names import VISION_MODEL_TYPES

IMAGE_TOKEN = "<|image_pad|>"
VISION_START_TOKEN = "<|vision_start|>"
VISION_END_TOKEN = "<|vision_end|>"
_PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class VisionInputs:
    """What a Qwen2-VL forward takes besides the ids: ``pixel_values`` are the flattened
    patches of every image, concatenated; ``image_grid_thw`` is one ``(t, h, w)`` row per image."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


@dataclass(frozen=True)
class VisionProcessor:
    """A VLM's tokenizer and image processor, with the placeholder token ids they share."""

    tokenizer: PreTrainedTokenizerBase
    image_processor: Qwen2VLImageProcessorPil

    @property
    def image_token_id(self) -> int:
        return special_token_id(self.tokenizer, IMAGE_TOKEN)

    @property
    def vision_start_token_id(self) -> int:
        return special_token_id(self.tokenizer, VISION_START_TOKEN)

    @property
    def vision_end_token_id(self) -> int:
        return special_token_id(self.tokenizer, VISION_END_TOKEN)

    @property
    def merge_size(self) -> int:
        return int(self.image_processor.merge_size)

    def save_pretrained(self, out_dir: str | Path) -> None:
        self.tokenizer.save_pretrained(out_dir)
        self.image_processor.save_pretrained(out_dir)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> VisionProcessor:
        path = Path(model_dir)
        if not (path / _PREPROCESSOR_FILE).is_file():
            raise FileNotFoundError(
                f"{path} has no {_PREPROCESSOR_FILE}: a vision-language model directory must "
                "hold its image processor"
            )
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(path)
        return cls(AutoTokenizer.from_pretrained(path), image_processor)


def is_vision_config(config: object) -> bool:
    """Whether a model config is a vision-language model this module serves."""
    return getattr(config, "model_type", None) in VISION_MODEL_TYPES


def special_token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int) or token_id == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no {token} token; it is not a Qwen2-VL tokenizer")
    return token_id


def pixel_inputs(processor: VisionProcessor, images: Sequence[Image.Image]) -> VisionInputs:
    """``pixel_values``/``image_grid_thw`` for ``images``, in order (at least one image)."""
    if not images:
        raise ValueError("pixel_inputs needs at least one image")
    out = processor.image_processor(images=list(images), return_tensors="pt")
    return VisionInputs(out["pixel_values"], out["image_grid_thw"])


def forward_kwargs(
    processor: VisionProcessor, input_ids: torch.Tensor, inputs: VisionInputs | None
) -> dict[str, torch.Tensor]:
    """The keyword arguments a Qwen2-VL forward (or ``generate``) takes besides ids and mask:
    pixels, grids and the modality map (0 text, 1 image) its M-RoPE positions are computed from;
    empty for a batch without images."""
    if inputs is None:
        return {}
    return {
        "pixel_values": inputs.pixel_values,
        "image_grid_thw": inputs.image_grid_thw,
        "mm_token_type_ids": (input_ids == processor.image_token_id).int(),
    }


def placeholder_counts(processor: VisionProcessor, grid_thw: torch.Tensor) -> list[int]:
    """Expanded placeholders per image: one per merged patch (``t·h·w / merge_size²``)."""
    merged = processor.merge_size**2
    return [int(row.prod().item()) // merged for row in grid_thw]


def expanded_placeholder_ids(
    processor: VisionProcessor, images: Sequence[Image.Image]
) -> list[list[int]]:
    """For each image, the run of ``<|image_pad|>`` ids the model attends to in its place."""
    if not images:
        return []
    counts = placeholder_counts(processor, pixel_inputs(processor, images).image_grid_thw)
    return [[processor.image_token_id] * count for count in counts]


def placeholder_runs(token_ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every maximal run of ``image_token_id``, in order."""
    runs: list[tuple[int, int]] = []
    start = -1
    for index, token in enumerate(token_ids):
        if token == image_token_id:
            if start < 0:
                start = index
        elif start >= 0:
            runs.append((start, index - start))
            start = -1
    if start >= 0:
        runs.append((start, len(token_ids) - start))
    return runs


def expand_placeholders(
    processor: VisionProcessor, token_ids: Sequence[int], images: Sequence[Image.Image]
) -> list[int]:
    """``token_ids`` with each single ``<|image_pad|>`` widened to its image's expanded run.

    The sequence must hold exactly one single-token placeholder per image, in image order; an
    already-expanded run or a count mismatch is refused rather than guessed at.
    """
    runs = placeholder_runs(token_ids, processor.image_token_id)
    if len(runs) != len(images):
        raise ValueError(
            f"{len(runs)} image placeholder(s) in the token ids but {len(images)} image(s)"
        )
    if any(length != 1 for _, length in runs):
        raise ValueError("token ids hold an already-expanded placeholder run; expand only once")
    expanded = expanded_placeholder_ids(processor, images)
    out: list[int] = []
    previous = 0
    for (start, _), run in zip(runs, expanded, strict=True):
        out.extend(token_ids[previous:start])
        out.extend(run)
        previous = start + 1
    out.extend(token_ids[previous:])
    return out


def ensure_expanded(
    processor: VisionProcessor, token_ids: Sequence[int], images: Sequence[Image.Image]
) -> list[int]:
    """``token_ids`` with every image's placeholders expanded: single placeholders (a prompt as
    the chat template wrote it) are widened; ids already expanded (a context carried on from an
    earlier turn) are checked and kept. Anything else is refused."""
    runs = placeholder_runs(token_ids, processor.image_token_id)
    if not images:
        if runs:
            raise ValueError(f"{len(runs)} image placeholder run(s) in the token ids but no image")
        return list(token_ids)
    if len(runs) == len(images) and all(length == 1 for _, length in runs):
        return expand_placeholders(processor, token_ids, images)
    check_expanded(processor, token_ids, pixel_inputs(processor, images).image_grid_thw)
    return list(token_ids)


def mrope_positions(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: dict[str, torch.Tensor],
) -> torch.Tensor:
    """``[3, B, L]`` Qwen2-VL position ids (temporal, height, width) of a padded batch: an
    image's patches share positions laid out on its grid, text continues after the largest.
    The model's own ``get_rope_index``, so an engine's positions are the trainer's."""
    # Qwen2VLForConditionalGeneration holds the Qwen2VLModel that owns get_rope_index.
    inner: Any = getattr(model, "model", model)
    positions, _deltas = inner.get_rope_index(
        input_ids,
        mm_token_type_ids=vision["mm_token_type_ids"],
        image_grid_thw=vision["image_grid_thw"],
        attention_mask=attention_mask,
    )
    return positions  # type: ignore[no-any-return]  # transformers leaves it unannotated


def check_expanded(
    processor: VisionProcessor, token_ids: Sequence[int], grid_thw: torch.Tensor
) -> None:
    """Refuse ids whose placeholder runs do not match the images' expanded sizes one to one."""
    runs = [length for _, length in placeholder_runs(token_ids, processor.image_token_id)]
    expected = placeholder_counts(processor, grid_thw)
    if runs != expected:
        raise ValueError(
            f"placeholder runs {runs} do not match the images' expanded sizes {expected}"
        )


def decode_png(data: bytes, *, max_pixels: int) -> Image.Image:
    """An image from the wire (``RolloutSample.images``) as RGB: PNG only, and its declared
    size checked against ``max_pixels`` before any pixel is decoded (decompression bombs)."""
    try:
        image = Image.open(io.BytesIO(data), formats=["PNG"])
    except (OSError, Image.DecompressionBombError) as error:
        raise ValueError(f"not a readable PNG image: {error}") from None
    width, height = image.size
    if width * height > max_pixels:
        image.close()
        raise ValueError(
            f"image declares {width}x{height} = {width * height:,} pixels, over "
            f"policy.generation.max_image_pixels ({max_pixels:,})"
        )
    try:
        return image.convert("RGB")
    except OSError as error:
        raise ValueError(f"PNG image data is corrupt: {error}") from None


def encode_png(image: Image.Image) -> bytes:
    """The lossless form images travel in on the wire (``RolloutSample.images``)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
