"""What test_trainer_ranks.py and its torchrun worker both use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dockyard.consumers.trainer.trainer_checkpoint import TrainerState, write_checkpoint

if TYPE_CHECKING:
    from dockyard.models.lora import PeftCheckpoint

ROOT = Path(__file__).resolve().parents[3]


def run_two_ranks(worker: str, out: Path) -> None:
    """``torchrun --standalone --nproc_per_node=2 tests/unit/trainer/WORKER OUT``: real gloo
    processes; fails the test with the ranks' stderr if they do."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "tests/unit/trainer" / worker),
        str(out),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


def checkpoint_of(
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    training_state: dict[str, object],
    directory: Path,
    adapter: PeftCheckpoint | None = None,
) -> None:
    directory.mkdir(parents=True)
    state = TrainerState(step=1, weight_version=1, dispatcher={}, replay_from_seq=1, ledger={})
    write_checkpoint(
        directory,
        model,
        None,
        state,
        model_state=weights,
        training_state=training_state,
        adapter=adapter,
    )


def optimizer_moments(training_state: dict[str, object]) -> dict[str, torch.Tensor]:
    """AdamW's first and second moments by parameter name."""
    optimizer = training_state["optimizer"]
    assert isinstance(optimizer, dict)
    return {
        f"{name}/{moment}": values[moment].clone()
        for name, values in optimizer["state"].items()
        for moment in ("exp_avg", "exp_avg_sq")
    }
