"""The ranks of the leader/follower check (run by test_trainer_ranks.py under torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/ranks_worker.py OUT_DIR

Rank 0 drives :class:`TrainerRanks` as the trainer loop does; rank 1 follows. Rank 0 writes
``OUT_DIR/sharded.pt`` (the initial weights' blob digest, the worker screen's measurements and
verdict on the initial weights, the merged step outcome, the weights and optimizer moments after
the step, and after loading ``OUT_DIR/single_ckpt``) and the checkpoint ``OUT_DIR/sharded_ckpt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks, World, follow, join_ranks, leave_ranks
from tests.unit.trainer.ranks_check import lead_step_and_resume, screen
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


def main() -> None:
    out = Path(sys.argv[1])
    world = World.from_environment()
    mesh = join_ranks(world)
    assert mesh is not None and world.size == 2
    config = load_config("configs/quickstart.yaml", BASE)
    trainer = PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"), mesh=mesh)
    if world.rank != 0:
        follow(trainer)
        leave_ranks()
        return
    ranks = TrainerRanks(trainer)
    initial_digest = digest_of_bytes(tensors_to_bytes(ranks.model_state()))
    screened = screen(ranks)  # the worker screen's pass, on the initial weights
    batch = on_policy(varied_batch(), "qwen2")
    lead_step_and_resume(ranks, batch, out, initial_digest=initial_digest, screen=screened)
    leave_ranks()


if __name__ == "__main__":
    main()
