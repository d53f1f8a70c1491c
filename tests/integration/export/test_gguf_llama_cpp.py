"""GGUF exports load in llama.cpp (llama-cpp-python) and reproduce transformers' logits.

llama-cpp-python is installed by scripts/ensure_llama_cpp.sh (from its wheel cache in CI).
Tolerances: measured max |logit difference| on these tiny models (logit std ~0.22) was
3.1e-4 (F32), 7.2e-4 (F16), 1.7e-2 (Q8_0); the bounds below leave ~1.5-2x headroom. A q/k layout
bug (Llama without the rotary permutation) measured 1.8e-2 in F32, 36x over the F32 bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_export_models import PROMPTS, reference_logits
from transformers import AutoTokenizer

from dockyard.export.gguf_build import convert_hf_to_gguf, validate_gguf

TOLERANCE = {"F32": 5e-4, "F16": 1.5e-3, "Q8_0": 3e-2}


def _llama_cpp_logits(llm: Any, token_ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(token_ids)
    return np.array(llm.scores[: len(token_ids)], dtype=np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("quant_type", list(TOLERANCE))
def test_gguf_logits_match_transformers(
    tiny_model, tmp_path: Path, quant_type: str, llama_class: type
) -> None:
    path = convert_hf_to_gguf(tiny_model.hf_dir, tmp_path / f"m-{quant_type}.gguf", quant_type)
    report = validate_gguf(path, expected_architecture=tiny_model.architecture)
    weight_types = {t for name, t in report.tensor_types.items() if name.endswith("attn_q.weight")}
    assert weight_types == {quant_type}
    llm = llama_class(model_path=str(path), logits_all=True, n_ctx=64, verbose=False)
    hf_tokenizer = AutoTokenizer.from_pretrained(tiny_model.hf_dir)
    worst = 0.0
    for prompt in PROMPTS:
        ids = hf_tokenizer(prompt).input_ids
        # The vocabulary and pre-tokenizer made it across: llama.cpp tokenizes like transformers.
        assert llm.tokenize(prompt.encode(), add_bos=False, special=False) == ids
        expected = reference_logits(tiny_model.model, ids).numpy()
        actual = _llama_cpp_logits(llm, ids)
        worst = max(worst, float(np.abs(actual - expected).max()))
    assert worst <= TOLERANCE[quant_type], f"{quant_type}: max |diff| {worst:.2e}"
    # The logits are not trivially equal (e.g. all zeros): they vary across the vocabulary.
    assert float(expected.std()) > 0.05


@pytest.mark.slow
def test_k_quant_through_llama_model_quantize(
    tiny_qwen2, tmp_path: Path, llama_class: type
) -> None:
    path = convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "m-q4_k_m.gguf", "q4_k_m")
    report = validate_gguf(path, expected_architecture="qwen2")
    assert report.file_type == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    f32 = convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "m-f32.gguf", "f32")
    assert path.stat().st_size < f32.stat().st_size / 3
    llm = llama_class(model_path=str(path), logits_all=True, n_ctx=64, verbose=False)
    ids = AutoTokenizer.from_pretrained(tiny_qwen2.hf_dir)(PROMPTS[0]).input_ids
    expected = reference_logits(tiny_qwen2.model, ids).numpy()
    actual = _llama_cpp_logits(llm, ids)
    # 4-bit weights: close in aggregate, not per logit.
    correlation = np.corrcoef(actual.ravel(), expected.ravel())[0, 1]
    assert correlation > 0.9, correlation
