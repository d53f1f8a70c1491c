"""GGUF builds of a Hugging Face model directory, for llama.cpp, ollama and other GGUF runtimes.

Two routes, chosen per call:

- **llama.cpp** (``llama_cpp_dir`` or ``DOCKYARD_LLAMA_CPP_DIR`` set): its
  ``convert_hf_to_gguf.py`` runs under ``sys.executable`` and writes F32/F16/BF16/Q8_0 directly;
  other types are quantized from an F32 intermediate by ``llama-quantize`` (or llama-cpp-python).
- **native** (no checkout given): Llama / Qwen2 models are written by gguf-py
  (:mod:`dockyard.export.gguf.native`), which quantizes F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 in
  numpy; K-quants (Q4_K_M, ...) go through llama-cpp-python's ``llama_model_quantize``.

Every output is checked with :func:`validate_gguf` before it is returned.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

from dockyard.export.gguf.llama_cpp_tools import (
    quantize_gguf,
    resolve_llama_cpp_dir,
    run_llama_cpp_converter,
)
from dockyard.export.gguf.native import write_gguf_natively
from dockyard.export.gguf.types import GgufExportError, MissingGgufDependencyError, QuantType
from dockyard.export.gguf.validate import GgufReport, GgufValidationError, validate_gguf

__all__ = [
    "GgufExportError",
    "GgufReport",
    "GgufValidationError",
    "MissingGgufDependencyError",
    "QuantType",
    "convert_hf_to_gguf",
    "export_gguf_variants",
    "validate_gguf",
]


def convert_hf_to_gguf(
    hf_ckpt_path: str | Path,
    out_path: str | Path,
    quant_type: str | QuantType = QuantType.F16,
    *,
    llama_cpp_dir: str | Path | None = None,
) -> Path:
    """Write one validated GGUF of ``quant_type`` (case-insensitive: ``"f16"``, ``"Q4_K_M"``)."""
    hf_dir = Path(hf_ckpt_path)
    target = Path(out_path)
    qtype = QuantType.parse(quant_type)
    checkout = resolve_llama_cpp_dir(llama_cpp_dir)
    if checkout is not None and qtype.llama_cpp_converter_outtype is not None:
        run_llama_cpp_converter(checkout, hf_dir, target, qtype.llama_cpp_converter_outtype)
    elif checkout is None and qtype.numpy_quantizable:
        write_gguf_natively(hf_dir, target, qtype)
    else:
        # A type neither writer produces directly: F32 intermediate, then llama.cpp's quantizer.
        with tempfile.TemporaryDirectory(
            dir=target.parent if target.parent.exists() else None
        ) as tmp:
            intermediate = Path(tmp) / "intermediate-f32.gguf"
            if checkout is not None:
                run_llama_cpp_converter(checkout, hf_dir, intermediate, "f32")
            else:
                write_gguf_natively(hf_dir, intermediate, QuantType.F32)
            quantize_gguf(intermediate, target, qtype, llama_cpp_dir=checkout)
    try:
        validate_gguf(target)
    except GgufValidationError:
        target.unlink(missing_ok=True)
        raise
    return target


def export_gguf_variants(
    hf_ckpt_path: str | Path,
    out_dir: str | Path,
    quant_types: Iterable[str | QuantType] = (QuantType.F16, QuantType.Q8_0),
    *,
    basename: str | None = None,
    llama_cpp_dir: str | Path | None = None,
) -> dict[QuantType, Path]:
    """One GGUF per type, named ``<basename>-<TYPE>.gguf`` (basename: the model dir's name)."""
    hf_dir = Path(hf_ckpt_path)
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    types = list(dict.fromkeys(QuantType.parse(value) for value in quant_types))
    if not types:
        raise GgufExportError("no GGUF types requested")
    name = basename or hf_dir.resolve().name
    return {
        qtype: convert_hf_to_gguf(
            hf_dir, directory / f"{name}-{qtype.value}.gguf", qtype, llama_cpp_dir=llama_cpp_dir
        )
        for qtype in types
    }
