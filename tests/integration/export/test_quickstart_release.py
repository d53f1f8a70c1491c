"""The quickstart's model released as docs/export.md documents it, command by command.

A trainer checkpoint of ``configs/quickstart.yaml``'s policy (written by the trainer's own
checkpoint writer, as a run's ``checkpoints/step_N`` is) -> ``dockyard export hf`` ->
``dockyard export gguf --type f16`` with no ``DOCKYARD_LLAMA_CPP_DIR`` (the native writer) ->
``dockyard export check-gguf``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dockyard.cli import main
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.ranks import load_trained_policy
from dockyard.consumers.trainer.trainer_checkpoint import TrainerState, write_checkpoint


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
