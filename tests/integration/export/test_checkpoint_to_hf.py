"""Trainer checkpoints (safetensors, sharded safetensors, DCP) -> HF dir with identical logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_export_models import PROMPTS, reference_logits
from transformers import AutoModelForCausalLM

from dockyard.checkpoints.model_files import (
    CheckpointError,
    convert_dcp_to_hf,
    save_model_checkpoint,
)
from dockyard.cli import main

LAYOUTS = {
    "safetensors": {"format": "safetensors"},
    "safetensors-sharded": {"format": "safetensors", "max_shard_bytes": 200_000},
    "dcp": {"format": "dcp"},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_checkpoint_converts_to_hf_with_identical_logits(
    tiny_model, tmp_path: Path, layout: str
) -> None:
    checkpoint = save_model_checkpoint(
        tiny_model.model, tmp_path / "ckpt", tokenizer=tiny_model.tokenizer, **LAYOUTS[layout]
    )
    if layout == "safetensors-sharded":
        assert len(list(checkpoint.glob("model-*-of-*.safetensors"))) > 1
    if layout == "dcp":
        assert (checkpoint / "model_dcp" / ".metadata").is_file()
    hf_dir = convert_dcp_to_hf(checkpoint, tmp_path / "hf")
    loaded = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    assert (hf_dir / "tokenizer.json").read_bytes() == (
        tiny_model.hf_dir / "tokenizer.json"
    ).read_bytes()
    for prompt in PROMPTS:
        ids = tiny_model.tokenizer(prompt).input_ids
        assert torch.equal(reference_logits(loaded, ids), reference_logits(tiny_model.model, ids))
    if tiny_model.model.config.tie_word_embeddings:
        # The tied output matrix is stored once, and transformers re-ties it on load.
        manifest = json.loads((checkpoint / "dockyard_checkpoint.json").read_text())
        assert manifest["tied_weights"] == {"lm_head.weight": "model.embed_tokens.weight"}
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_dtype_cast_on_export(tiny_qwen2, tmp_path: Path) -> None:
    checkpoint = save_model_checkpoint(tiny_qwen2.model, tmp_path / "ckpt", format="dcp")
    hf_dir = convert_dcp_to_hf(checkpoint, tmp_path / "hf", dtype=torch.bfloat16)
    assert json.loads((hf_dir / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = AutoModelForCausalLM.from_pretrained(hf_dir)
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    expected = tiny_qwen2.model.model.embed_tokens.weight.to(torch.bfloat16)
    assert torch.equal(loaded.model.embed_tokens.weight, expected)


def test_cli_export_hf(tiny_llama, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = save_model_checkpoint(
        tiny_llama.model, tmp_path / "ckpt", format="dcp", tokenizer=tiny_llama.tokenizer
    )
    out = tmp_path / "hf"
    code = main(["export", "hf", "--checkpoint", str(checkpoint), "--out", str(out)])
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tiny_llama.tokenizer(PROMPTS[0]).input_ids
    assert torch.equal(reference_logits(loaded, ids), reference_logits(tiny_llama.model, ids))


def test_not_a_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="not a model checkpoint"):
        convert_dcp_to_hf(tmp_path / "empty", tmp_path / "out")
    code = main(
        ["export", "hf", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]
    )
    assert code == 3
    assert "config.json is missing" in capsys.readouterr().err
