"""Tiny causal LMs built from a config in code: no download, deterministic from a seed.

Sizes keep vLLM's CPU attention happy (it accepts head sizes 32, 64, 80, ... only): the default
hidden size 128 with 4 heads gives head_dim 32. Built-in recipes are addressed as
``tiny://NAME`` model names (see :data:`TINY_RECIPES`), so every process that loads
``tiny://qwen2-arithmetic`` gets bit-identical initial weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3MoeConfig,
)

from dockyard.models.names import TINY_SCHEME
from dockyard.models.seeded import seeded_model
from dockyard.models.tiny_vlm import build_qwen2_vl_policy, build_qwen2_vl_processor
from dockyard.models.tokenizers import (
    DEFAULT_CORPUS,
    BpeStyle,
    build_calculator_tokenizer,
    build_character_tokenizer,
    train_bpe_tokenizer,
)
from dockyard.models.vision import VisionProcessor, is_vision_config

Arch = Literal["qwen2", "llama", "qwen3_moe"]

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny model; the defaults are the quickstart's ≈0.5M-parameter Qwen2."""

    arch: Arch = "qwen2"
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    num_hidden_layers: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = True
    seed: int = 0
    #: ``qwen3_moe`` only: every decoder layer's MLP is a mixture of ``num_experts`` SwiGLU
    #: experts of ``moe_intermediate_size`` hidden units, each token routed to its top
    #: ``num_experts_per_tok`` (Transformers stores them fused: ``[experts, 2·I, H]`` and
    #: ``[experts, H, I]`` per layer, which expert parallelism splits along the first dimension).
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim not in VLLM_CPU_HEAD_SIZES:
            raise ValueError(
                f"head_dim {self.head_dim} is not one vLLM's CPU attention supports "
                f"({', '.join(map(str, VLLM_CPU_HEAD_SIZES))})"
            )


def build_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    config_class = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig}[
        spec.arch
    ]
    moe: dict[str, object] = (
        {
            "num_experts": spec.num_experts,
            "num_experts_per_tok": spec.num_experts_per_tok,
            "moe_intermediate_size": spec.moe_intermediate_size,
            "head_dim": spec.head_dim,  # Qwen3 takes it explicitly
            # Top-k weights renormalised to sum to 1, as the released Qwen3-MoE models do.
            "norm_topk_prob": True,
        }
        if spec.arch == "qwen3_moe"
        else {}
    )
    config: PretrainedConfig = config_class(
        **moe,
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        num_hidden_layers=spec.num_hidden_layers,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return config


def build_tiny_model(
    spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast, *, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """Randomly initialised model for ``tokenizer``; the same spec gives the same weights.

    The global RNG is forked so building a model never perturbs a caller's random stream.
    """

    def make(config: PretrainedConfig) -> PreTrainedModel:
        model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]  # unannotated in transformers
        return model

    config = build_config(spec, tokenizer)
    return seeded_model(make, config, seed=spec.seed, tokenizer=tokenizer, dtype=dtype)


def build_arithmetic_policy(
    seed: int = 0, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The quickstart's policy: a character vocabulary (PAD, BOS, EOS, digits, ``+``, ``=``)
    and a ≈0.5M-parameter Qwen2 (hidden 128, 4 heads, 2 layers, intermediate 512, tied)."""
    tokenizer = build_character_tokenizer()
    model = build_tiny_model(TinyModelSpec(seed=seed, max_position_embeddings=64), tokenizer)
    return model.to(dtype), tokenizer  # type: ignore[arg-type]  # functools.wraps on transformers' .to mistypes self


def build_calculator_policy(
    seed: int = 0, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The multi-turn demo's policy: the quickstart's model over :func:`build_calculator_tokenizer`
    (``a*b=``, a calculator call, its observation, the answer)."""
    tokenizer = build_calculator_tokenizer()
    model = build_tiny_model(TinyModelSpec(seed=seed, max_position_embeddings=64), tokenizer)
    return model.to(dtype), tokenizer  # type: ignore[arg-type]  # functools.wraps on transformers' .to mistypes self


def build_moe_arithmetic_policy(
    seed: int = 0, *, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The quickstart's task on a mixture of experts: the character vocabulary and a Qwen3-MoE
    of the quickstart model's width (hidden 128, 4 heads, 2 layers) whose every MLP is 4
    experts, top-2 (≈0.33M parameters)."""
    tokenizer = build_character_tokenizer()
    spec = TinyModelSpec(arch="qwen3_moe", seed=seed, max_position_embeddings=64)
    return build_tiny_model(spec, tokenizer, dtype=dtype), tokenizer


def build_bpe_policy(
    arch: Arch = "qwen2",
    *,
    corpus: Iterable[str] = DEFAULT_CORPUS,
    vocab_size: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny general-text model with a byte-level BPE trained on ``corpus``."""
    style: BpeStyle = "gpt2" if arch == "llama" else "qwen2"
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab_size, style=style)
    model = build_tiny_model(TinyModelSpec(arch=arch, seed=seed), tokenizer)
    return model.to(dtype), tokenizer  # type: ignore[arg-type]  # functools.wraps on transformers' .to mistypes self


@dataclass(frozen=True)
class TinyRecipe:
    description: str
    build: Callable[[torch.dtype], tuple[PreTrainedModel, PreTrainedTokenizerFast]] = field(
        repr=False
    )
    #: A vision-language recipe's processor, built around the recipe's tokenizer.
    processor: Callable[[PreTrainedTokenizerFast], VisionProcessor] | None = field(
        default=None, repr=False
    )


TINY_RECIPES: dict[str, TinyRecipe] = {
    "qwen2-arithmetic": TinyRecipe(
        "character-level Qwen2 for the quickstart's 2-digit addition (≈0.5M parameters)",
        lambda dtype: build_arithmetic_policy(seed=0, dtype=dtype),
    ),
    "qwen2-calculator": TinyRecipe(
        "character-level Qwen2 with calculator tool-call tokens, for the multi-turn demo",
        lambda dtype: build_calculator_policy(seed=0, dtype=dtype),
    ),
    "qwen2-bpe": TinyRecipe(
        "Qwen2 with a byte-level BPE trained on a built-in corpus",
        lambda dtype: build_bpe_policy("qwen2", dtype=dtype),
    ),
    "qwen3-moe-arithmetic": TinyRecipe(
        "character-level Qwen3-MoE (4 experts, top-2) for the quickstart's 2-digit addition",
        lambda dtype: build_moe_arithmetic_policy(seed=0, dtype=dtype),
    ),
    "qwen3-moe-bpe": TinyRecipe(
        "Qwen3-MoE (4 experts, top-2) with a byte-level BPE trained on a built-in corpus",
        lambda dtype: build_bpe_policy("qwen3_moe", dtype=dtype),
    ),
    "llama-bpe": TinyRecipe(
        "Llama with a byte-level BPE trained on a built-in corpus",
        lambda dtype: build_bpe_policy("llama", dtype=dtype),
    ),
    "qwen2-vl-bpe": TinyRecipe(
        "Qwen2-VL (2-layer text model, 2-block vision tower) with Qwen2-VL's special tokens, "
        "chat template and image processor (4-16 tokens per image)",
        lambda dtype: build_qwen2_vl_policy(seed=0, dtype=dtype),
        build_qwen2_vl_processor,
    ),
}


def _recipe(name: str) -> TinyRecipe:
    recipe = TINY_RECIPES.get(name)
    if recipe is None:
        known = ", ".join(f"{TINY_SCHEME}{key}" for key in TINY_RECIPES)
        raise ValueError(f"unknown tiny model {TINY_SCHEME}{name}; known: {known}")
    return recipe


def build_tiny_recipe(
    name: str, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    return _recipe(name).build(dtype)


def build_tiny_processor(name: str, tokenizer: PreTrainedTokenizerFast) -> VisionProcessor | None:
    """The processor of a vision-language recipe around its ``tokenizer``; None for text ones."""
    recipe = _recipe(name)
    return None if recipe.processor is None else recipe.processor(tokenizer)


def save_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: str | Path,
    *,
    processor: VisionProcessor | None = None,
) -> Path:
    """Write an HF directory (safetensors + config + tokenizer.json, and a VLM's
    preprocessor_config.json). A VLM without its processor is refused: the directory would load
    as a model nothing can feed images to."""
    if is_vision_config(model.config) and processor is None:
        raise ValueError("a vision-language model is saved with its processor (processor=...)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if processor is not None:
        processor.save_pretrained(out)
    return out
