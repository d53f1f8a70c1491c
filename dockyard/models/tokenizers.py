"""Tokenizers built in code (no download): a byte-level BPE trained on a corpus, and the
character-level vocabulary of the quickstart's arithmetic task.

Both are wrapped in :class:`transformers.PreTrainedTokenizerFast`, so ``save_pretrained`` writes a
``tokenizer.json`` that transformers, vLLM and the GGUF exporter all read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import (
    PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX,
)

# "qwen2": the pipeline transformers' Qwen2Tokenizer rebuilds around a saved vocabulary (NFC +
# Qwen2's split regex + byte level). AutoTokenizer (and so vLLM) loads a qwen2 directory with
# that class, so a Qwen2 model's tokenizer must use it to encode identically everywhere.
# "gpt2": plain byte-level BPE, loaded as-is (the generic backend) for other architectures.
BpeStyle = Literal["qwen2", "gpt2"]

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)

# The quickstart task is `BOS a+b=` → `digits EOS`; one token per character keeps the model
# tiny and makes every answer digit its own decision for the reward to shape.
ARITHMETIC_CHARACTERS = tuple("0123456789+=")

# The multi-turn demo's calculator episode in a few tokens: the Hermes call around an expression
# and the observation around a number are one token each, so the model's choices are the digits
# it copies and whether it calls the tool at all.
CALCULATOR_CHARACTERS = tuple("0123456789+*=")
CALCULATOR_TOKENS = (
    "<tool_call>",
    '{"name": "calculator", "arguments": {"expression": "',
    '"}}',
    "</tool_call>",
    "<tool_response>\n",
    "\n</tool_response>\n",
)

# A small built-in corpus so `init-tiny` works with no file at all. Its content only shapes
# which merges the BPE learns; the model built on it is random anyway.
DEFAULT_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Question: what is 12 + 30? Answer: 42.",
    "def add(a, b):\n    return a + b\n",
    "Rollout workers generate samples; the trainer updates the policy weights.",
    "A weight version names its blob by digest, and workers verify it before loading.",
    "Reward: 1.0 if the final answer is correct, else 0.0.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
    "<think>Let me add the numbers step by step.</think> The answer is 17.",
)


def _wrap(tokenizer: Tokenizer, *, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # unannotated in transformers
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        # Named explicitly: model-specific tokenizer classes that AutoTokenizer picks for a
        # qwen2/llama directory would otherwise add their default unknown token
        # ("<|endoftext|>"), growing the vocabulary past the model's embedding table.
        unk_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        model_max_length=model_max_length,
        padding_side="left",
    )


def train_bpe_tokenizer(
    corpus: Iterable[str] = DEFAULT_CORPUS,
    *,
    vocab_size: int = 512,
    style: BpeStyle = "gpt2",
    model_max_length: int = 2048,
) -> PreTrainedTokenizerFast:
    """Train a GPT-2-style byte-level BPE on ``corpus``; deterministic for a given corpus.

    The 256 byte symbols are always in the alphabet, so any text encodes even when the corpus
    is tiny; ``vocab_size`` bounds the merges learned on top of them.
    """
    minimum = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size must be >= {minimum} (specials + 256 bytes), got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE())
    if style == "qwen2":
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    return _wrap(tokenizer, model_max_length=model_max_length)


def build_calculator_tokenizer() -> PreTrainedTokenizerFast:
    """Characters of ``a*b=`` plus :data:`CALCULATOR_TOKENS` (plain added tokens, not special:
    an observation encoded with ``split_special_tokens`` keeps them)."""
    tokenizer = build_character_tokenizer(CALCULATOR_CHARACTERS)
    tokenizer.add_tokens([AddedToken(text, normalized=False) for text in CALCULATOR_TOKENS])
    return tokenizer


def build_character_tokenizer(
    characters: Sequence[str] = ARITHMETIC_CHARACTERS,
    *,
    add_bos: bool = True,
    model_max_length: int = 64,
) -> PreTrainedTokenizerFast:
    """A one-token-per-character vocabulary: ids 0..2 are PAD, BOS, EOS, then ``characters``.

    With ``add_bos`` the tokenizer prepends BOS when called with ``add_special_tokens=True``
    (the default), so ``tokenizer("12+30=")`` is the model's prompt as-is.
    """
    if len(set(characters)) != len(characters) or any(len(c) != 1 for c in characters):
        raise ValueError("characters must be distinct single characters")
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *characters))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A",
            special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
        )
    return _wrap(tokenizer, model_max_length=model_max_length)
