"""Convert a Llama / Qwen2 Hugging Face directory to GGUF with gguf-py alone (no llama.cpp).

It follows llama.cpp's ``convert_hf_to_gguf.py`` step by step so that its output matches that
converter's: the same tensor order (safetensors key order), names (gguf-py's tensor map), per-
tensor types (1-D tensors, norms and biases stay F32; a block type a row cannot hold falls back to
F16), Llama's q/k row permutation (Qwen2 has none), the same metadata keys in the same order
(general.* from ``gguf.Metadata``, hyper-parameters, file type, quantization version, then the
vocabulary through ``gguf.SpecialVocab``).

Byte-level BPE tokenizers with the GPT-2 pre-tokenizer (``tokenizer.ggml.pre = "gpt-2"``) or
Qwen2's (``"qwen2"``) are written natively. llama.cpp recognises other pre-tokenizers by hashing
their output on a probe text, and a wrong ``pre`` tokenizes differently at run time, so anything
else is refused with a pointer to the llama.cpp route rather than guessed, except one-token-per-
character tokenizers, which llama.cpp's converter cannot write either (:mod:`.character_vocab`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dockyard.export.gguf.character_vocab import add_character_vocab, is_character_vocabulary
from dockyard.export.gguf.types import GgufExportError, MissingGgufDependencyError, QuantType
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

GGUF_INSTALL_HINT = "pip install 'dockyard[gguf]' (or pip install gguf)"

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


def import_gguf() -> Any:
    try:
        import gguf
    except ImportError as error:
        raise MissingGgufDependencyError(
            f"GGUF export needs the 'gguf' package: {GGUF_INSTALL_HINT}"
        ) from error
    return gguf


@dataclass(frozen=True)
class _Hparams:
    raw: dict[str, Any]

    def get(self, *keys: str) -> Any:
        for key in keys:
            if key in self.raw:
                return self.raw[key]
        return None

    @property
    def architecture(self) -> str:
        architectures = self.raw.get("architectures") or []
        if len(architectures) != 1 or not isinstance(architectures[0], str):
            raise GgufExportError(
                f"config.json 'architectures' must name one class: {architectures}"
            )
        name: str = architectures[0]
        return name


def _load_hparams(hf_dir: Path) -> _Hparams:
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise GgufExportError(
            f"{hf_dir}: config.json not found; not a Hugging Face model directory"
        )
    return _Hparams(json.loads(config_path.read_text(encoding="utf-8")))


def _iter_safetensors(hf_dir: Path) -> Iterator[tuple[str, Any]]:
    """Tensors in llama.cpp's order: shard files sorted, keys in each file's (sorted) order."""
    from safetensors import safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise GgufExportError(
            f"{hf_dir}: no *.safetensors files (export the checkpoint to HF first)"
        )
    for path in files:
        with safe_open(path, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118  (safe_open is not a mapping)
                yield name, handle.get_tensor(name)


def _permute(weights: Any, n_head: int, n_head_kv: int | None) -> Any:
    """Undo HF's rotary layout for Llama q/k (llama.cpp's ``LlamaModel.permute``)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _tensor_type(gguf: Any, new_name: str, n_dims: int, requested: Any) -> Any:
    if n_dims <= 1 or new_name.endswith("_norm.weight") or new_name[-7:] != ".weight":
        return gguf.GGMLQuantizationType.F32
    return requested


def _add_tensors(
    writer: Any, gguf: Any, hf_dir: Path, hparams: _Hparams, arch: Any, qtype: QuantType
) -> None:
    import torch

    n_blocks = hparams.get("num_hidden_layers", "n_layer", "num_layers")
    tensor_map = gguf.get_tensor_name_map(arch, n_blocks)
    n_head = hparams.get("num_attention_heads", "n_heads")
    n_kv_head = hparams.get("num_key_value_heads", "n_kv_heads")
    undo_permute = hparams.architecture == "LlamaForCausalLM"
    requested = gguf.GGMLQuantizationType[qtype.value]
    for name, tensor in _iter_safetensors(hf_dir):
        if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
            continue
        if tensor.dtype not in (torch.float16, torch.float32):
            tensor = tensor.to(torch.float32)
        if undo_permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            tensor = _permute(tensor, n_head, n_head)
        if undo_permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            tensor = _permute(tensor, n_head, n_kv_head)
        new_name = tensor_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise GgufExportError(f"cannot map tensor {name!r} of {hparams.architecture} to GGUF")
        data = tensor.numpy()
        data_type = _tensor_type(gguf, new_name, data.ndim, requested)
        try:
            quantized = gguf.quants.quantize(data, data_type)
        except gguf.QuantError as error:
            # Same fallback as llama.cpp: a row length the block size does not divide -> F16.
            log.warning("tensor falls back to F16", tensor=new_name, reason=str(error))
            data_type = gguf.GGMLQuantizationType.F16
            quantized = gguf.quants.quantize(data, data_type)
        writer.add_tensor(new_name, quantized, raw_dtype=data_type)


def _rope_theta(hparams: _Hparams) -> float | None:
    rope = hparams.raw.get("rope_parameters") or hparams.raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None):
        raise GgufExportError(
            f"rope type {rope_type!r} is not written natively; use llama.cpp's converter "
            "(set DOCKYARD_LLAMA_CPP_DIR)"
        )
    theta = rope.get("rope_theta", hparams.raw.get("rope_theta"))
    return float(theta) if theta is not None else None


def _add_hparams(writer: Any, gguf: Any, hparams: _Hparams, file_type: Any) -> None:
    """``TextModel.set_gguf_parameters`` for the fields a Llama / Qwen2 config has, in its order."""
    writer.add_block_count(hparams.get("num_hidden_layers", "n_layer", "num_layers"))
    context = hparams.get("max_position_embeddings", "n_ctx", "n_positions", "max_length")
    if context is not None:
        writer.add_context_length(context)
    writer.add_embedding_length(hparams.get("hidden_size", "n_embd", "dim"))
    writer.add_feed_forward_length(hparams.get("intermediate_size", "n_inner", "hidden_dim"))
    writer.add_head_count(hparams.get("num_attention_heads", "n_head", "n_heads"))
    if (n_kv := hparams.get("num_key_value_heads", "n_kv_heads")) is not None:
        writer.add_head_count_kv(n_kv)
    if (theta := _rope_theta(hparams)) is not None:
        writer.add_rope_freq_base(theta)
    if (eps := hparams.get("rms_norm_eps", "norm_eps")) is not None:
        writer.add_layer_norm_rms_eps(eps)
    if (head_dim := hparams.get("head_dim")) is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(file_type)
    if hparams.architecture == "LlamaForCausalLM":
        writer.add_vocab_size(hparams.raw["vocab_size"])
        rope_dim = head_dim or hparams.raw["hidden_size"] // hparams.raw["num_attention_heads"]
        writer.add_rope_dimension_count(rope_dim)


def _token_looks_special(token: str) -> bool:
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<｜") and token.endswith("｜>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _qwen2_pattern() -> str | None:
    try:
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
    except ImportError:
        return None
    return PRETOKENIZE_REGEX


def pre_tokenizer_name(tokenizer: Any) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` for the pre-tokenizer transformers actually applies.

    Read from the loaded tokenizer, not tokenizer.json: transformers 5 substitutes a model
    family's own pre-tokenizer (a ``qwen2`` directory tokenizes with Qwen2's regex).
    """
    pre = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if (
        len(steps) == 2
        and steps[0].get("type") == "Split"
        and steps[1].get("type") == "ByteLevel"
        and not steps[1].get("use_regex", True)
        and steps[0].get("pattern", {}).get("Regex") == _qwen2_pattern()
    ):
        return "qwen2"
    raise GgufExportError(
        f"the native GGUF writer knows the GPT-2 and Qwen2 byte-level BPE pre-tokenizers, not "
        f"{json.dumps(pre)[:200]}; use llama.cpp's converter, which recognises more "
        "(set DOCKYARD_LLAMA_CPP_DIR or pass llama_cpp_dir)"
    )


def _add_vocab(writer: Any, gguf: Any, hf_dir: Path, hparams: _Hparams) -> None:
    """A byte-level BPE as llama.cpp's converter writes it, or a one-character-per-token one."""
    tokenizer_path = hf_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise GgufExportError(f"{hf_dir}: tokenizer.json not found; GGUF needs the vocabulary")
    tokenizer_json = json.loads(tokenizer_path.read_text(encoding="utf-8"))
    if is_character_vocabulary(tokenizer_json):
        add_character_vocab(writer, gguf, hf_dir, tokenizer_json, hparams.raw["vocab_size"])
        return
    # Decided from the file: transformers 5 loads a qwen2/llama directory's tokenizer with that
    # family's pre-tokenizer whatever its model, so a WordLevel one would pass for a BPE below.
    model_type = (tokenizer_json.get("model") or {}).get("type")
    if model_type != "BPE":
        raise GgufExportError(
            f"the native GGUF writer writes byte-level BPE and one-token-per-character "
            f"tokenizers, not this {model_type} one; use llama.cpp's converter "
            "(set DOCKYARD_LLAMA_CPP_DIR or pass llama_cpp_dir)"
        )
    _add_bpe_vocab(writer, gguf, hf_dir, hparams)


def _add_bpe_vocab(writer: Any, gguf: Any, hf_dir: Path, hparams: _Hparams) -> None:
    """``_set_vocab_gpt2`` + ``get_vocab_base`` of llama.cpp's converter."""
    from transformers import AutoTokenizer

    if hparams.architecture == "LlamaForCausalLM":
        tokenizer_config = hf_dir / "tokenizer_config.json"
        if tokenizer_config.is_file():
            prefix = json.loads(tokenizer_config.read_text(encoding="utf-8")).get(
                "add_prefix_space"
            )
            if prefix is not None:
                writer.add_add_space_prefix(prefix)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    pre = pre_tokenizer_name(tokenizer)
    vocab_size = hparams.raw.get("vocab_size", len(tokenizer.vocab))
    if max(tokenizer.vocab.values()) >= vocab_size:
        raise GgufExportError(f"tokenizer has ids beyond config vocab_size {vocab_size}")
    reverse_vocab = {token_id: token for token, token_id in tokenizer.vocab.items()}
    added_vocab = tokenizer.get_added_vocab()
    added_decoder = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    token_types: list[int] = []
    for token_id in range(vocab_size):
        if token_id not in reverse_vocab:
            tokens.append(f"[PAD{token_id}]")
            token_types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse_vocab[token_id]
        if token in added_vocab:
            if not added_decoder[token_id].normalized:
                decoded = tokenizer.decode(tokenizer.encode(token, add_special_tokens=False))
                if not isinstance(decoded, str):  # one sequence decodes to one string
                    raise GgufExportError(f"token {token_id} decodes to {decoded!r}")
                token = decoded
            if added_decoder[token_id].special or _token_looks_special(token):
                token_types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                token_types.append(gguf.TokenType.USER_DEFINED)
        else:
            token_types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    gguf.SpecialVocab(hf_dir, load_merges=True).add_to_gguf(writer)


def write_gguf_natively(hf_dir: Path, out_path: Path, qtype: QuantType) -> Path:
    """Write one GGUF of ``qtype`` (a float or gguf-py block type) for a Llama / Qwen2 model."""
    gguf = import_gguf()
    if not qtype.numpy_quantizable:
        raise GgufExportError(f"{qtype.value} is not written natively (gguf-py cannot quantize it)")
    hparams = _load_hparams(hf_dir)
    architecture = hparams.architecture
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise GgufExportError(
            f"the native GGUF writer handles {', '.join(SUPPORTED_ARCHITECTURES)}, not "
            f"{architecture}; set DOCKYARD_LLAMA_CPP_DIR to use llama.cpp's converter"
        )
    arch = gguf.MODEL_ARCH.LLAMA if architecture == "LlamaForCausalLM" else gguf.MODEL_ARCH.QWEN2
    file_type = gguf.LlamaFileType["ALL_F32" if qtype is QuantType.F32 else f"MOSTLY_{qtype.value}"]
    writer = gguf.GGUFWriter(
        path=None, arch=gguf.MODEL_ARCH_NAMES[arch], endianess=gguf.GGUFEndian.LITTLE
    )
    _add_tensors(writer, gguf, hf_dir, hparams, arch, qtype)
    # prepare_metadata: general.* first, then hyper-parameters, then the vocabulary.
    total, shared, expert, expert_count = writer.get_total_parameter_count()
    metadata = gguf.Metadata.load(None, hf_dir, None, total)
    if metadata.name is None:
        metadata.name = hf_dir.name
    if metadata.size_label is None and total > 0:
        metadata.size_label = gguf.size_label(total, shared, expert, expert_count)
    writer.add_type(gguf.GGUFType.MODEL)
    metadata.set_gguf_meta_model(writer)
    _add_hparams(writer, gguf, hparams, file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(writer, gguf, hf_dir, hparams)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file(path=out_path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log.info("GGUF written", path=str(out_path), type=qtype.value, architecture=architecture)
    return out_path
