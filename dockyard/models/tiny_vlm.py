"""A tiny Qwen2-VL built in code from a seed: ``tiny://qwen2-vl-bpe``.

The family's pieces at toy size, so the multimodal path (image placeholders, pixel values, the
vision tower's gradients) runs end to end on a CPU with no download: a byte-level BPE carrying
Qwen2-VL's special tokens and chat template, Qwen2-VL's image processor with a small pixel
budget (a screenshot becomes 4–16 placeholder tokens), a 2-layer text model with head_dim 32
(vLLM's CPU attention accepts it) and a 2-block vision tower.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from tokenizers import AddedToken
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)
from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

from dockyard.models.seeded import seeded_model
from dockyard.models.tokenizers import DEFAULT_CORPUS, train_bpe_tokenizer
from dockyard.models.vision import (
    IMAGE_TOKEN,
    VISION_END_TOKEN,
    VISION_START_TOKEN,
    VisionProcessor,
    special_token_id,
)

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VIDEO_TOKEN = "<|video_pad|>"
#: Qwen2-VL's added special tokens (its tokenizer_config's order).
QWEN2_VL_SPECIAL_TOKENS = (
    END_OF_TEXT,
    IM_START,
    IM_END,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    VISION_START_TOKEN,
    VISION_END_TOKEN,
    "<|vision_pad|>",
    IMAGE_TOKEN,
    VIDEO_TOKEN,
)

#: Qwen2-VL-Instruct's chat template: an image content part becomes
#: ``<|vision_start|><|image_pad|><|vision_end|>`` (one placeholder, expanded per image later).
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# One merged token covers (patch_size · merge_size)² = 28² pixels.
MERGED_PATCH_PIXELS = 28 * 28


@dataclass(frozen=True)
class TinyVlmSpec:
    """Shape of the tiny Qwen2-VL; hidden 128 over 4 heads gives vLLM's head_dim 32."""

    hidden_size: int = 128
    num_attention_heads: int = 4
    num_hidden_layers: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 2048
    vision_embed_dim: int = 64
    vision_heads: int = 2
    vision_depth: int = 2
    min_image_tokens: int = 4
    max_image_tokens: int = 16
    seed: int = 0

    @property
    def mrope_section(self) -> list[int]:
        """Qwen2-VL's (temporal, height, width) split of the rotary half-dimension, in the
        original's 16:24:24 proportion ([16, 24, 24] at head_dim 128)."""
        half = self.hidden_size // self.num_attention_heads // 2
        temporal = half // 4
        spatial = (half - temporal) // 2
        return [temporal, spatial, half - temporal - spatial]


def build_qwen2_vl_tokenizer(
    corpus: Iterable[str] = DEFAULT_CORPUS, *, vocab_size: int = 512
) -> PreTrainedTokenizerFast:
    """A Qwen2-style byte-level BPE with Qwen2-VL's special tokens and chat template;
    ``<|im_end|>`` ends a turn (the EOS) and ``<|endoftext|>`` pads, as in the family."""
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab_size, style="qwen2")
    tokenizer.add_tokens(
        [AddedToken(token, special=True, normalized=False) for token in QWEN2_VL_SPECIAL_TOKENS],
        special_tokens=True,
    )
    tokenizer.eos_token = IM_END
    tokenizer.pad_token = END_OF_TEXT
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    return tokenizer


def build_tiny_image_processor(spec: TinyVlmSpec) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(
        min_pixels=spec.min_image_tokens * MERGED_PATCH_PIXELS,
        max_pixels=spec.max_image_tokens * MERGED_PATCH_PIXELS,
    )


def build_tiny_vlm(
    spec: TinyVlmSpec, tokenizer: PreTrainedTokenizerFast, *, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """A randomly initialised Qwen2-VL; the same spec gives the same weights (global RNG forked)."""

    def token_id(token: str) -> int:
        return special_token_id(tokenizer, token)

    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_attention_heads,
            "num_hidden_layers": spec.num_hidden_layers,
            "intermediate_size": spec.intermediate_size,
            "max_position_embeddings": spec.max_position_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": spec.mrope_section,
            },
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
            "tie_word_embeddings": True,
        },
        vision_config={
            "depth": spec.vision_depth,
            "embed_dim": spec.vision_embed_dim,
            "num_heads": spec.vision_heads,
            "hidden_size": spec.hidden_size,
            "mlp_ratio": 2,
        },
        image_token_id=token_id(IMAGE_TOKEN),
        video_token_id=token_id(VIDEO_TOKEN),
        vision_start_token_id=token_id(VISION_START_TOKEN),
        vision_end_token_id=token_id(VISION_END_TOKEN),
        tie_word_embeddings=True,
    )

    def make(config: PretrainedConfig) -> PreTrainedModel:
        return Qwen2VLForConditionalGeneration(config)  # type: ignore[no-untyped-call]  # unannotated in transformers

    return seeded_model(make, config, seed=spec.seed, tokenizer=tokenizer, dtype=dtype)


def build_qwen2_vl_policy(
    seed: int = 0, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    tokenizer = build_qwen2_vl_tokenizer()
    return build_tiny_vlm(TinyVlmSpec(seed=seed), tokenizer, dtype=dtype), tokenizer


def build_qwen2_vl_processor(tokenizer: PreTrainedTokenizerFast) -> VisionProcessor:
    return VisionProcessor(tokenizer, build_tiny_image_processor(TinyVlmSpec()))
