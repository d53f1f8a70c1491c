"""Tiny Llama / Qwen2 models and a byte-level BPE tokenizer, built in code (no download).

Random weights give near-uniform logits, so comparisons use tolerances, not greedy tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

EOS = "<|endoftext|>"
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "GRPO samples a group of completions per prompt and normalises their rewards.",
    "Asynchronous rollouts carry the weight version of every token they generate.",
    "1 + 1 = 2, 2 * 3 = 6, 10 / 4 = 2.5",
] * 20
PROMPTS = [
    "The quick brown fox",
    "def add(a, b): return a + b",
    "rewards 1 + 2 = 3",
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    # GPT-2 style: byte-level pre-tokenizer with its regex, byte-level decoder.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=None
    )


def build_model(architecture: str, vocab_size: int, *, seed: int = 0) -> PreTrainedModel:
    common = {
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "vocab_size": vocab_size,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
    }
    if architecture == "qwen2":
        config = Qwen2Config(**common, tie_word_embeddings=False)
    elif architecture == "llama":
        config = LlamaConfig(**common, tie_word_embeddings=True)
    else:
        raise ValueError(architecture)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def save_hf(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, directory: Path) -> Path:
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@torch.no_grad()
def reference_logits(model: PreTrainedModel, token_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([token_ids])).logits[0].float()
