"""llama.cpp's tools: its converter script, ``llama-quantize``, and llama-cpp-python's quantizer.

The converter is run as ``sys.executable <dir>/convert_hf_to_gguf.py`` from a llama.cpp checkout
(``DOCKYARD_LLAMA_CPP_DIR`` or ``llama_cpp_dir``); the llama-cpp-python sdist vendors one under
``vendor/llama.cpp`` (``scripts/ensure_llama_cpp.sh`` prints its path). K-quants come from the
``llama-quantize`` binary when the checkout has a build, else from llama-cpp-python's
``llama_model_quantize`` — the same C function the binary calls.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dockyard.export.gguf.types import GgufExportError, MissingGgufDependencyError, QuantType
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

LLAMA_CPP_DIR_ENV = "DOCKYARD_LLAMA_CPP_DIR"
LLAMA_CPP_PYTHON_HINT = (
    "pip install llama-cpp-python (scripts/ensure_llama_cpp.sh installs it from a wheel cache), "
    f"or set {LLAMA_CPP_DIR_ENV} to a llama.cpp checkout with a built llama-quantize"
)
_OUTPUT_TAIL_CHARS = 4000


def resolve_llama_cpp_dir(llama_cpp_dir: str | Path | None) -> Path | None:
    """The llama.cpp checkout to shell out to: the argument, else the environment, else None."""
    chosen = llama_cpp_dir if llama_cpp_dir is not None else os.environ.get(LLAMA_CPP_DIR_ENV)
    if not chosen:
        return None
    directory = Path(chosen)
    if not (directory / "convert_hf_to_gguf.py").is_file():
        raise GgufExportError(
            f"{directory}: convert_hf_to_gguf.py not found; {LLAMA_CPP_DIR_ENV} / llama_cpp_dir "
            "must point at a llama.cpp checkout"
        )
    return directory


def run_llama_cpp_converter(
    llama_cpp_dir: Path, hf_dir: Path, out_path: Path, outtype: str, *, timeout_s: float = 3600
) -> Path:
    """Run `convert_hf_to_gguf.py HF_DIR --outfile OUT --outtype TYPE` with this interpreter."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(llama_cpp_dir / "convert_hf_to_gguf.py"),
        str(hf_dir),
        "--outfile",
        str(out_path),
        "--outtype",
        outtype,
    ]
    # The checkout's own gguf-py is what its converter was written against.
    env = {**os.environ, "PYTHONPATH": str(llama_cpp_dir / "gguf-py")}
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    if result.returncode != 0 or not out_path.is_file():
        raise GgufExportError(
            f"llama.cpp's convert_hf_to_gguf.py failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout)[-_OUTPUT_TAIL_CHARS:]}"
        )
    log.info("llama.cpp converter wrote GGUF", path=str(out_path), outtype=outtype)
    return out_path


def find_llama_quantize(llama_cpp_dir: Path | None) -> Path | None:
    candidates = []
    if llama_cpp_dir is not None:
        candidates += [
            llama_cpp_dir / "build" / "bin" / "llama-quantize",
            llama_cpp_dir / "llama-quantize",
        ]
    on_path = shutil.which("llama-quantize")
    if on_path:
        candidates.append(Path(on_path))
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


def quantize_gguf(
    source: Path, out_path: Path, qtype: QuantType, *, llama_cpp_dir: Path | None = None
) -> Path:
    """Quantize a float GGUF to ``qtype`` with llama.cpp (the binary if found, else the binding)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    binary = find_llama_quantize(llama_cpp_dir)
    if binary is not None:
        result = subprocess.run(
            [str(binary), str(source), str(out_path), qtype.value],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise GgufExportError(
                f"llama-quantize failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout)[-_OUTPUT_TAIL_CHARS:]}"
            )
        return out_path
    try:
        import llama_cpp
    except ImportError as error:
        raise MissingGgufDependencyError(
            f"GGUF type {qtype.value} needs llama.cpp's quantizer: {LLAMA_CPP_PYTHON_HINT}"
        ) from error
    file_type = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.value}", None)
    if file_type is None:
        raise GgufExportError(f"this llama-cpp-python has no file type for {qtype.value}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type
    params.nthread = os.cpu_count() or 1
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(out_path).encode(), ctypes.byref(params)
    )
    if status != 0 or not out_path.is_file():
        raise GgufExportError(f"llama_model_quantize to {qtype.value} failed (status {status})")
    log.info("GGUF quantized with llama-cpp-python", path=str(out_path), type=qtype.value)
    return out_path
