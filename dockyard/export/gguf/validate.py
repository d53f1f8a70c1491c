"""Check a GGUF before it is shipped: readable, right architecture, all tensors, finite floats.

A corrupt or truncated file is refused with the reason (bad magic, header that does not parse,
tensor data running past the end of the file) rather than with a numpy traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dockyard.export.gguf.native import import_gguf
from dockyard.export.gguf.types import GgufExportError

# Per-block tensors every Llama / Qwen2 GGUF must have (names after gguf-py's tensor map).
_BLOCK_TENSORS = (
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
_QWEN2_BLOCK_BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")
_GLOBAL_TENSORS = ("token_embd.weight", "output_norm.weight")
_FLOAT_TYPES = ("F32", "F16", "BF16")


class GgufValidationError(GgufExportError):
    """The file is not a usable GGUF; the message says why."""


@dataclass(frozen=True)
class GgufReport:
    path: Path
    architecture: str
    block_count: int
    file_type: int | None
    tensor_types: dict[str, str] = field(default_factory=dict)  # tensor name -> GGML type name


def _field_value(reader: Any, key: str) -> Any:
    entry = reader.get_field(key)
    return None if entry is None else entry.contents()


def _expected_tensors(architecture: str, block_count: int) -> list[str]:
    names = list(_GLOBAL_TENSORS)
    per_block = list(_BLOCK_TENSORS)
    if architecture == "qwen2":
        per_block += list(_QWEN2_BLOCK_BIASES)
    names += [f"blk.{block}.{suffix}" for block in range(block_count) for suffix in per_block]
    return names


def validate_gguf(path: str | Path, *, expected_architecture: str | None = None) -> GgufReport:
    """Read ``path`` with gguf-py and check it; raise :class:`GgufValidationError` if unusable."""
    gguf = import_gguf()
    file_path = Path(path)
    if not file_path.is_file():
        raise GgufValidationError(f"{file_path}: no such file")
    size = file_path.stat().st_size
    with file_path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise GgufValidationError(
            f"{file_path}: not a GGUF file (magic {magic!r}, expected b'GGUF')"
        )
    try:
        reader = gguf.GGUFReader(file_path)
    except Exception as error:  # gguf-py raises ValueError/IndexError/... on a cut header
        raise GgufValidationError(
            f"{file_path}: header does not parse ({type(error).__name__}: {error}); "
            "the file is corrupt or truncated"
        ) from error
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size or tensor.data.nbytes != tensor.n_bytes:
            raise GgufValidationError(
                f"{file_path}: tensor {tensor.name} needs bytes up to {end} but the file has "
                f"{size}; the file is truncated"
            )
    architecture = _field_value(reader, "general.architecture")
    if not architecture:
        raise GgufValidationError(f"{file_path}: general.architecture is missing")
    if expected_architecture is not None and architecture != expected_architecture:
        raise GgufValidationError(
            f"{file_path}: architecture {architecture!r}, expected {expected_architecture!r}"
        )
    block_count = _field_value(reader, f"{architecture}.block_count")
    if block_count is None:
        raise GgufValidationError(f"{file_path}: {architecture}.block_count is missing")
    tensor_types = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    if architecture in ("llama", "qwen2"):
        missing = [
            name
            for name in _expected_tensors(architecture, block_count)
            if name not in tensor_types
        ]
        if missing:
            raise GgufValidationError(
                f"{file_path}: {len(missing)} expected tensors missing, e.g. {missing[:5]}"
            )
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name not in _FLOAT_TYPES:
            continue
        values = (
            gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            if type_name == "BF16"
            else np.asarray(tensor.data)
        )
        if not np.isfinite(values).all():
            bad = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
            raise GgufValidationError(
                f"{file_path}: tensor {tensor.name} ({type_name}) has {bad} non-finite values"
            )
    return GgufReport(
        path=file_path,
        architecture=architecture,
        block_count=int(block_count),
        file_type=_field_value(reader, "general.file_type"),
        tensor_types=tensor_types,
    )
