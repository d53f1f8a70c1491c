"""Session fixtures for the export tests: tiny Qwen2 (untied) and Llama (tied) HF directories."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from tiny_export_models import build_model, build_tokenizer, save_hf
from transformers import PreTrainedModel, PreTrainedTokenizerFast


@dataclass(frozen=True)
class TinyModel:
    architecture: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    hf_dir: Path


REPO_ROOT = Path(__file__).resolve().parents[3]


def ensure_llama_cpp() -> None:
    """The test setup CI runs: llama-cpp-python (and the llama.cpp sources it vendors) from
    the wheel cache, built there once when missing (~15 minutes on 2 cores, then seconds).

    It runs when this directory is collected, like the vLLM install, so a first-time build is
    not cut short by the per-test timeout.
    """
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("llama_cpp") is not None and _llama_cpp_sources_present():
        return
    subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "ensure_llama_cpp.sh")],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    importlib.invalidate_caches()


@pytest.fixture(scope="session")
def llama_class() -> type:
    """``llama_cpp.Llama`` (installed when this directory was collected)."""
    from llama_cpp import Llama

    return Llama


def _llama_cpp_sources_present() -> bool:
    import os

    cache = Path(os.environ.get("DOCKYARD_WHEEL_CACHE", Path.home() / ".cache/dockyard/wheels"))
    return any((cache / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def _tiny(architecture: str, tokenizer: PreTrainedTokenizerFast, root: Path) -> TinyModel:
    model = build_model(architecture, len(tokenizer))
    return TinyModel(architecture, model, tokenizer, save_hf(model, tokenizer, root / architecture))


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer) -> TinyModel:
    return _tiny("qwen2", tiny_tokenizer, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer) -> TinyModel:
    return _tiny("llama", tiny_tokenizer, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="session", params=["qwen2", "llama"])
def tiny_model(request: pytest.FixtureRequest) -> TinyModel:
    return request.getfixturevalue(f"tiny_{request.param}")


ensure_llama_cpp()
