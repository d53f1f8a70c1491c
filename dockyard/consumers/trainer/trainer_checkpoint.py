"""What a trainer checkpoint holds, and how it is written and read back.

``step_N/``: the model in ``checkpointing.model_save_format`` (safetensors, or torch DCP) with its
HF config and tokenizer, written by :mod:`dockyard.checkpoints.model_files` so that
``dockyard export hf`` turns the directory into a Hugging Face build; ``optimizer.pt`` (optimizer
+ scheduler, if ``save_optimizer``); ``rng.pt``; ``trainer_state.json`` (step, weight version,
dispatcher position, stream position, ledger).

The model and optimizer state are whole tensors by parameter name whether the trainer ran in one
process or sharded over ranks (gathered to rank 0 first, :mod:`~dockyard.consumers.trainer.ranks`),
so a checkpoint written either way resumes either way.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dockyard.checkpoints.model_files import load_checkpoint_state_dict, save_model_checkpoint
from dockyard.consumers.trainer.ledger import LedgerSnapshot
from dockyard.models.lora import PeftCheckpoint

OPTIMIZER_FILE = "optimizer.pt"
#: Under LoRA: the adapter in PEFT's format (the model file holds the merged weights).
ADAPTER_DIR = "adapter"
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng.pt"


@dataclass
class TrainerState:
    step: int
    weight_version: int
    dispatcher: dict[str, int]
    replay_from_seq: int  # first scored-stream sequence not covered by the ledger
    ledger: LedgerSnapshot
    #: ``VersionLineage.to_dict()``; None in checkpoints written before it existed.
    lineage: dict[str, list[list[int]]] | None = None


def write_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    tokenizer: object,
    state: TrainerState,
    *,
    model_state: dict[str, torch.Tensor],
    training_state: dict[str, object] | None,
    model_format: str = "safetensors",
    adapter: PeftCheckpoint | None = None,
) -> None:
    """``model_state``: the whole weights (``PolicyTrainer.model_state``); ``model`` gives the
    HF config. ``training_state`` (``PolicyTrainer.state_dict``): None = not saved."""
    save_model_checkpoint(
        model,  # type: ignore[arg-type]  # a transformers model, typed nn.Module here
        directory,
        format=model_format,  # type: ignore[arg-type]  # checked against CheckpointFormat by the config
        tokenizer=tokenizer,  # type: ignore[arg-type]  # a transformers tokenizer, typed object here
        state_dict=model_state,
    )
    if adapter is not None:
        adapter.save(directory / ADAPTER_DIR)
    if training_state is not None:
        torch.save(training_state, directory / OPTIMIZER_FILE)
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


@dataclass
class Checkpoint:
    weights: dict[str, torch.Tensor]  # whole, tied duplicates absent
    training_state: dict[str, object] | None  # None: saved without the optimizer
    state: TrainerState


def read_checkpoint(directory: Path) -> Checkpoint:
    """The checkpoint's contents; restores this process's random number generators."""
    weights = load_checkpoint_state_dict(directory)
    optimizer_path = directory / OPTIMIZER_FILE
    training_state = (
        torch.load(optimizer_path, weights_only=False) if optimizer_path.exists() else None
    )
    rng = torch.load(directory / RNG_FILE, weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    state = TrainerState(**json.loads((directory / STATE_FILE).read_text()))
    return Checkpoint(weights, training_state, state)
