"""One-token-per-character vocabularies (the tiny recipes' tokenizers) written to GGUF.

``build_character_tokenizer`` makes a ``WordLevel`` model over single characters behind a
``Split(".")`` pre-tokenizer: every character is its own token, a character outside the vocabulary
is the unknown token. llama.cpp's converter has no route for it (it recognises tokenizers by
hashing their output on a probe text), and written as a byte-level BPE it would need merges a
character vocabulary does not have (llama.cpp refuses such a file at load).

It is written as a unigram vocabulary (``tokenizer.ggml.model = "t5"``, llama.cpp's UGM): with
every piece one character long, the only segmentation of in-vocabulary text is character by
character, whatever the scores, and a character outside the vocabulary becomes the unknown token
instead of aborting the runtime (llama.cpp's SentencePiece-BPE route falls back to byte tokens
this vocabulary lacks). Known difference: llama.cpp merges a run of unknown characters into one
unknown token, where the trainer's tokenizer gives one per character.

Whitespace: UGM escapes a space to ``▁`` before it looks tokens up, so a space token is stored as
``▁``; no prefix space is added and runs of spaces are kept, as the trainer's tokenizer does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dockyard.export.gguf.types import GgufExportError

_SPACE_ESCAPE = "\u2581"  # SentencePiece's "▁"


def is_character_vocabulary(tokenizer_json: Mapping[str, Any]) -> bool:
    """Whether ``tokenizer.json`` describes a one-token-per-character ``WordLevel`` tokenizer."""
    model = tokenizer_json.get("model") or {}
    if model.get("type") != "WordLevel" or tokenizer_json.get("normalizer") is not None:
        return False
    pre = tokenizer_json.get("pre_tokenizer") or {}
    splits_characters = (
        pre.get("type") == "Split"
        and pre.get("pattern") == {"Regex": "."}
        and pre.get("behavior") == "Isolated"
        and not pre.get("invert", False)
    )
    added = {token["content"] for token in tokenizer_json.get("added_tokens", [])}
    vocab: dict[str, int] = model.get("vocab") or {}
    return splits_characters and all(len(token) == 1 for token in vocab.keys() - added)


def add_character_vocab(
    writer: Any, gguf: Any, hf_dir: Path, tokenizer_json: Mapping[str, Any], vocab_size: int
) -> None:
    """Write the vocabulary of a tokenizer :func:`is_character_vocabulary` accepts."""
    vocab: dict[str, int] = dict(tokenizer_json["model"]["vocab"])
    added = {token["id"]: token for token in tokenizer_json.get("added_tokens", [])}
    if _SPACE_ESCAPE in vocab and " " in vocab:
        raise GgufExportError(f"the vocabulary has both ' ' and {_SPACE_ESCAPE!r}; UGM merges them")
    by_id = {token_id: token for token, token_id in vocab.items()}
    by_id.update({token_id: token["content"] for token_id, token in added.items()})
    if max(by_id) >= vocab_size:
        raise GgufExportError(f"tokenizer has ids beyond config vocab_size {vocab_size}")
    tokens: list[str] = []
    token_types: list[int] = []
    for token_id in range(vocab_size):
        if token_id not in by_id:
            tokens.append(f"[PAD{token_id}]")
            token_types.append(gguf.TokenType.UNUSED)
        elif token_id in added:
            tokens.append(by_id[token_id])
            special = added[token_id].get("special", False)
            token_types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[token_id].replace(" ", _SPACE_ESCAPE))
            token_types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("t5")
    writer.add_token_list(tokens)
    # Equal scores: with one-character pieces there is one segmentation to choose anyway.
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types(token_types)
    writer.add_add_space_prefix(False)
    writer.add_remove_extra_whitespaces(False)
    special_vocab = gguf.SpecialVocab(hf_dir, load_merges=False)
    # UGM adds EOS (T5's habit) unless told otherwise; add only what the trainer's tokenizer adds
    # (its post-processor, which SpecialVocab reads).
    special_vocab.add_special_token.setdefault("bos", False)
    special_vocab.add_special_token.setdefault("eos", False)
    special_vocab.add_to_gguf(writer)
