"""GGUF export: validation, clear errors, the CLI, and parity with llama.cpp's own converter."""

from __future__ import annotations

import os
import re
import shutil
import sys
from hashlib import sha256
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from dockyard.cli import main
from dockyard.export.gguf.native import pre_tokenizer_name
from dockyard.export.gguf_build import (
    GgufExportError,
    GgufValidationError,
    MissingGgufDependencyError,
    convert_hf_to_gguf,
    export_gguf_variants,
    validate_gguf,
)


def _llama_cpp_checkout() -> Path:
    """The llama.cpp sources scripts/ensure_llama_cpp.sh unpacks from the llama-cpp-python sdist."""
    import llama_cpp

    default = (
        Path.home()
        / ".cache/dockyard/wheels/src"
        / f"llama_cpp_python-{llama_cpp.__version__}/vendor/llama.cpp"
    )
    checkout = Path(os.environ.get("DOCKYARD_LLAMA_CPP_DIR", default))
    assert (checkout / "convert_hf_to_gguf.py").is_file(), (
        f"{checkout}: run scripts/ensure_llama_cpp.sh (it unpacks llama.cpp's converter)"
    )
    return checkout


@pytest.fixture(scope="module")
def reference_converter(tmp_path_factory: pytest.TempPathFactory, tiny_qwen2, tiny_llama) -> Path:
    """llama.cpp's converter with the test tokenizers registered, as convert_hf_to_gguf_update.py
    would register a new tokenizer: it only recognises tokenizers whose probe-text hash it knows.
    """
    source = _llama_cpp_checkout()
    copy = tmp_path_factory.mktemp("llama_cpp")
    shutil.copy2(source / "convert_hf_to_gguf.py", copy)
    shutil.copytree(source / "conversion", copy / "conversion")
    shutil.copytree(source / "gguf-py", copy / "gguf-py")
    base = copy / "conversion" / "base.py"
    text = base.read_text()
    chktxt = eval(re.search(r"\n\s*chktxt = (.*)\n", text).group(1))  # the converter's probe text
    registrations = ""
    for tiny in (tiny_qwen2, tiny_llama):
        tokenizer = AutoTokenizer.from_pretrained(tiny.hf_dir)
        digest = sha256(str(tokenizer.encode(chktxt)).encode()).hexdigest()
        registrations += f'        if chkhsh == "{digest}":\n'
        registrations += f'            res = "{pre_tokenizer_name(tokenizer)}"\n'
    marker = "        if res is None:\n"
    assert marker in text
    base.write_text(text.replace(marker, registrations + marker, 1))
    return copy


@pytest.mark.slow
@pytest.mark.parametrize(("architecture", "quant_type"), [("qwen2", "f16"), ("llama", "q8_0")])
def test_native_writer_is_byte_identical_to_llama_cpp(
    request: pytest.FixtureRequest,
    reference_converter: Path,
    tmp_path: Path,
    architecture: str,
    quant_type: str,
) -> None:
    tiny = request.getfixturevalue(f"tiny_{architecture}")
    native = convert_hf_to_gguf(tiny.hf_dir, tmp_path / "native.gguf", quant_type)
    shelled = convert_hf_to_gguf(
        tiny.hf_dir, tmp_path / "llama_cpp.gguf", quant_type, llama_cpp_dir=reference_converter
    )
    assert native.read_bytes() == shelled.read_bytes()


@pytest.mark.slow
def test_shell_out_reports_llama_cpp_refusal(tiny_qwen2, tmp_path: Path) -> None:
    # The unmodified converter does not know the test tokenizer: its error comes through verbatim.
    with pytest.raises(GgufExportError, match="BPE pre-tokenizer was not recognized"):
        convert_hf_to_gguf(
            tiny_qwen2.hf_dir, tmp_path / "x.gguf", "f16", llama_cpp_dir=_llama_cpp_checkout()
        )


def test_llama_cpp_dir_must_be_a_checkout(tiny_qwen2, tmp_path: Path) -> None:
    with pytest.raises(GgufExportError, match=r"convert_hf_to_gguf\.py not found"):
        convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "x.gguf", "f16", llama_cpp_dir=tmp_path)


def test_variants_and_validation_report(tiny_llama, tmp_path: Path) -> None:
    paths = export_gguf_variants(tiny_llama.hf_dir, tmp_path, ["f32", "BF16", "q4_0"], basename="m")
    assert sorted(path.name for path in paths.values()) == [
        "m-BF16.gguf",
        "m-F32.gguf",
        "m-Q4_0.gguf",
    ]
    report = validate_gguf(paths["BF16"])
    assert report.architecture == "llama" and report.block_count == 2
    assert report.tensor_types["blk.0.ffn_up.weight"] == "BF16"
    assert report.tensor_types["blk.0.attn_norm.weight"] == "F32"  # norms stay F32
    assert (
        "output.weight" not in report.tensor_types
    )  # tied embeddings: llama.cpp reuses token_embd
    assert validate_gguf(paths["Q4_0"]).tensor_types["blk.1.attn_q.weight"] == "Q4_0"


def test_corrupt_and_truncated_files_are_refused(tiny_qwen2, tmp_path: Path) -> None:
    good = convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "good.gguf", "f16")
    data = good.read_bytes()
    (tmp_path / "magic.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(GgufValidationError, match="not a GGUF file"):
        validate_gguf(tmp_path / "magic.gguf")
    (tmp_path / "short.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(GgufValidationError, match="truncated"):
        validate_gguf(tmp_path / "short.gguf")
    (tmp_path / "header.gguf").write_bytes(data[:64])
    with pytest.raises(GgufValidationError, match="corrupt or truncated"):
        validate_gguf(tmp_path / "header.gguf")
    with pytest.raises(GgufValidationError, match="architecture 'qwen2', expected 'llama'"):
        validate_gguf(good, expected_architecture="llama")


def test_non_finite_weights_are_refused_and_not_left_behind(tiny_qwen2, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen2.hf_dir, broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        GgufValidationError, match=r"blk\.1\.ffn_up\.weight \(F16\) has 1 non-finite"
    ):
        convert_hf_to_gguf(broken, tmp_path / "broken.gguf", "f16")
    assert not (tmp_path / "broken.gguf").exists()


def test_unsupported_inputs_get_clear_errors(tiny_qwen2, tmp_path: Path) -> None:
    with pytest.raises(GgufExportError, match="unknown GGUF type 'q9_9'"):
        convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "x.gguf", "q9_9")
    other = tmp_path / "gpt2"
    shutil.copytree(tiny_qwen2.hf_dir, other)
    config = (other / "config.json").read_text().replace("Qwen2ForCausalLM", "GPT2LMHeadModel")
    (other / "config.json").write_text(config)
    with pytest.raises(GgufExportError, match="DOCKYARD_LLAMA_CPP_DIR"):
        convert_hf_to_gguf(other, tmp_path / "x.gguf", "f16")


def test_missing_dependencies_name_what_to_install(
    tiny_qwen2, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand-in for "not installed": a None entry in sys.modules makes the import raise ImportError.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(MissingGgufDependencyError, match="pip install llama-cpp-python"):
        convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "x.gguf", "Q4_K_M")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(MissingGgufDependencyError, match=r"pip install 'dockyard\[gguf\]'"):
        convert_hf_to_gguf(tiny_qwen2.hf_dir, tmp_path / "x.gguf", "f16")


def test_cli_gguf_and_check(tiny_qwen2, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "export",
            "gguf",
            "--model",
            str(tiny_qwen2.hf_dir),
            "--out",
            str(out),
            "--type",
            "f16",
            "--type",
            "q8_0",
            "--basename",
            "tiny",
        ]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["tiny-F16.gguf", "tiny-Q8_0.gguf"]
    assert main(["export", "check-gguf", str(out / "tiny-Q8_0.gguf")]) == 0
    assert "architecture=qwen2 blocks=2" in capsys.readouterr().out
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    assert main(["export", "check-gguf", str(tmp_path / "bad.gguf")]) == 3
    assert "not a GGUF file" in capsys.readouterr().err
