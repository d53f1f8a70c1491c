"""What a trainer checkpoint holds, and how it is written and read back.

``step_N/``: ``model.safetensors`` (+ the HF config and tokenizer, so the directory converts to a
Hugging Face build), ``optimizer.pt`` (optimizer + scheduler, if ``save_optimizer``),
``trainer_state.json`` (step, weight version, dispatcher position, stream position, ledger, RNG).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from dockyard.consumers.trainer.policy_trainer import PolicyTrainer

MODEL_FILE = "model.safetensors"
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


def write_checkpoint(
    directory: Path,
    trainer: PolicyTrainer,
    tokenizer: object,
    state: TrainerState,
    *,
    save_optimizer: bool,
) -> None:
    save_model(trainer.model, str(directory / MODEL_FILE))
    trainer.model.config.save_pretrained(directory)  # type: ignore[union-attr]
    tokenizer.save_pretrained(directory)  # type: ignore[attr-defined]
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


def read_checkpoint(directory: Path, trainer: PolicyTrainer) -> TrainerState:
    load_model(trainer.model, str(directory / MODEL_FILE))
    optimizer_path = directory / OPTIMIZER_FILE
    if optimizer_path.exists():
        trainer.load_state_dict(torch.load(optimizer_path, weights_only=False))
    rng = torch.load(directory / RNG_FILE, weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    return TrainerState(**json.loads((directory / STATE_FILE).read_text()))
