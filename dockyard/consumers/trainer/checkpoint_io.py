"""What a trainer checkpoint holds, and how it is written and read back.

``step_N/``: the model in ``checkpointing.model_save_format`` (safetensors, or torch DCP) with its
HF config and tokenizer, written by :mod:`dockyard.utils.native_checkpoint` so that
``dockyard export hf`` turns the directory into a Hugging Face build; ``optimizer.pt`` (optimizer
+ scheduler, if ``save_optimizer``); ``rng.pt``; ``trainer_state.json`` (step, weight version,
dispatcher position, stream position, ledger).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dockyard.consumers.trainer.backend import TrainerBackend
from dockyard.utils.native_checkpoint import load_checkpoint_state_dict, save_model_checkpoint

OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"


@dataclass
class TrainerState:
    step: int
    weight_version: int
    dispatcher: dict[str, int]
    replay_from_seq: int  # first scored-stream sequence not covered by the ledger
    ledger: dict[str, object]
    #: ``VersionLineage.to_dict()``; None in checkpoints written before it existed.
    lineage: dict[str, list[list[int]]] | None = None


def write_checkpoint(
    directory: Path,
    trainer: TrainerBackend,
    tokenizer: object,
    state: TrainerState,
    *,
    save_optimizer: bool,
    model_format: str = "safetensors",
) -> None:
    save_model_checkpoint(
        trainer.model,  # type: ignore[arg-type]
        directory,
        format=model_format,  # type: ignore[arg-type]
        tokenizer=tokenizer,  # type: ignore[arg-type]
    )
    if save_optimizer:
        torch.save(trainer.state_dict(), directory / OPTIMIZER_FILE)
    torch.save(
        {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
        },
        directory / RNG_FILE,
    )
    (directory / STATE_FILE).write_text(json.dumps(state.__dict__))


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Load a checkpoint's weights; only tied duplicates (saved once) may be absent."""
    result = model.load_state_dict(state, strict=False)
    loaded = {model.state_dict()[name].data_ptr() for name in state}
    current = model.state_dict()
    untied = [name for name in result.missing_keys if current[name].data_ptr() not in loaded]
    if untied or result.unexpected_keys:
        raise ValueError(
            f"{where}: checkpoint does not match the model (missing {untied}, "
            f"unexpected {result.unexpected_keys})"
        )


def read_checkpoint(directory: Path, trainer: TrainerBackend) -> TrainerState:
    load_weights(trainer.model, load_checkpoint_state_dict(directory), directory)
    optimizer_path = directory / OPTIMIZER_FILE
    if optimizer_path.exists():
        trainer.load_state_dict(torch.load(optimizer_path, weights_only=False))
    rng = torch.load(directory / RNG_FILE, weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    return TrainerState(**json.loads((directory / STATE_FILE).read_text()))
