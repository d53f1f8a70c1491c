"""The quickstart's model released as docs/export.md documents it, command by command.

A trainer checkpoint of ``configs/quickstart.yaml``'s policy (written by the trainer's own
checkpoint writer, as a run's ``checkpoints/step_N`` is) -> ``dockyard export hf`` ->
``dockyard export gguf --type f16`` with no ``DOCKYARD_LLAMA_CPP_DIR`` (the native writer) ->
``dockyard export check-gguf``, and the file loads in llama.cpp, tokenizes like the trainer's
character tokenizer and gives the trainer's logits (the F16 bound of test_gguf_llama_cpp.py).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dockyard.cli import main
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.ranks import load_trained_policy
from dockyard.consumers.trainer.trainer_checkpoint import TrainerState, write_checkpoint

F16_TOLERANCE = 1.5e-3
PROMPTS = ["12+30=", "99+10=", "7+7=14"]


@dataclass(frozen=True)
class Release:
    model: torch.nn.Module
    tokenizer: Any  # a transformers tokenizer
    checkpoint: Path
    hf_dir: Path
    gguf_path: Path


def _quickstart_checkpoint(directory: Path) -> tuple[torch.nn.Module, Any]:
    """What a run's ``checkpoints/step_N`` holds, from the trainer's checkpoint writer."""
    model, tokenizer = load_trained_policy(load_config("configs/quickstart.yaml"))
    state = TrainerState(step=1, weight_version=1, dispatcher={}, replay_from_seq=1, ledger={})
    directory.mkdir(parents=True)
    write_checkpoint(
        directory, model, tokenizer, state, model_state=model.state_dict(), training_state=None
    )
    return model.eval(), tokenizer


def _export(checkpoint: Path, release: Path) -> tuple[Path, Path]:
    """The two documented commands; each must succeed."""
    hf_dir, gguf_path = release / "hf", release / "model-f16.gguf"
    assert main(["export", "hf", "--checkpoint", str(checkpoint), "--out", str(hf_dir)]) == 0
    code = main(
        ["export", "gguf", "--model", str(hf_dir), "--out", str(gguf_path), "--type", "f16"]
    )
    assert code == 0
    return hf_dir, gguf_path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    root = tmp_path_factory.mktemp("quickstart")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("DOCKYARD_LLAMA_CPP_DIR", raising=False)  # the native writer
        checkpoint = root / "runs/quickstart/checkpoints/step_1"
        model, tokenizer = _quickstart_checkpoint(checkpoint)
        hf_dir, gguf_path = _export(checkpoint, root / "release")
    return Release(model, tokenizer, checkpoint, hf_dir, gguf_path)


def test_the_hf_export_names_its_class_and_the_gguf_is_valid(
    release: Release, capsys: pytest.CaptureFixture[str]
) -> None:
    # What save_pretrained of the model class writes, and what GGUF converters go by.
    for directory in (release.checkpoint, release.hf_dir):
        config = json.loads((directory / "config.json").read_text())
        assert config["architectures"] == ["Qwen2ForCausalLM"]
    capsys.readouterr()
    assert main(["export", "check-gguf", str(release.gguf_path)]) == 0
    assert "architecture=qwen2" in capsys.readouterr().out


def test_a_checkpoint_written_without_architectures_still_exports(
    release: Release, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints written before the writer named the class: the export names it."""
    monkeypatch.delenv("DOCKYARD_LLAMA_CPP_DIR", raising=False)
    old = tmp_path / "step_1"
    shutil.copytree(release.checkpoint, old)
    config = json.loads((old / "config.json").read_text())
    del config["architectures"]
    (old / "config.json").write_text(json.dumps(config))
    hf_dir, _ = _export(old, tmp_path / "release")
    assert json.loads((hf_dir / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


def test_llama_cpp_runs_the_gguf_as_the_trainer_does(release: Release, llama_class: type) -> None:
    llm = llama_class(model_path=str(release.gguf_path), logits_all=True, n_ctx=64, verbose=False)
    try:
        for prompt in PROMPTS:
            ids = release.tokenizer(prompt).input_ids  # BOS, then one token per character
            assert llm.tokenize(prompt.encode(), add_bos=True, special=False) == ids
            assert llm.detokenize(ids).decode() == prompt
            llm.reset()
            llm.eval(ids)
            actual = np.array(llm.scores[: len(ids)], dtype=np.float32)
            with torch.no_grad():
                expected = release.model(torch.tensor([ids])).logits[0].float().numpy()
            assert float(np.abs(actual - expected).max()) <= F16_TOLERANCE
            # Not trivially equal (e.g. all zeros): the logits vary across the vocabulary.
            assert float(expected.std()) > 0.05
        # A character the vocabulary lacks is its unknown token, as in the trainer's tokenizer,
        # not a crash of the runtime.
        assert llm.tokenize(b"1a2", add_bos=False, special=False) == (
            release.tokenizer("1a2", add_special_tokens=False).input_ids
        )
    finally:
        llm.close()


def test_a_word_level_tokenizer_that_is_not_per_character_is_refused(
    release: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not written as a BPE without merges, which check-gguf passed and llama.cpp cannot load."""
    words = tmp_path / "hf"
    shutil.copytree(release.hf_dir, words)
    tokenizer = json.loads((words / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {"type": "Whitespace"}
    (words / "tokenizer.json").write_text(json.dumps(tokenizer))
    out = tmp_path / "model.gguf"
    code = main(["export", "gguf", "--model", str(words), "--out", str(out), "--type", "f16"])
    assert code == 3
    assert "not this WordLevel one" in capsys.readouterr().err
    assert not out.exists()
