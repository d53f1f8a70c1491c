"""The ranks of the LoRA data-parallel check (run by test_lora_data_parallel.py under torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/lora_dp_worker.py OUT_DIR

Each rank seeds its RNG differently before peft draws the adapters' initial ``A``: rank 0's must
reach every rank. Each rank trains on its own prompt groups (FSDP2 over the peft model) and writes
``OUT_DIR/rank<r>.pt``: its loss, the adapters' whole gradients, the weight event before and after
one step, the merged weights, the optimizer state, and what a sharded trainer resumed from the
checkpoint rank 0 wrote publishes. Rank 0 also writes that checkpoint, ``OUT_DIR/ckpt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, whole_tensor
from dockyard.consumers.trainer.ranks import TrainerRanks, follow
from dockyard.consumers.trainer.trainer_checkpoint import read_checkpoint
from tests.unit.trainer.ranks_check import checkpoint_of
from tests.unit.trainer.test_lora_training import LORA
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    batch = on_policy(varied_batch(), "qwen2")
    shard = shard_by_groups(batch, rank, world)
    config = load_config("configs/quickstart.yaml", BASE + LORA)

    torch.manual_seed(rank)  # a different adapter initialisation on each rank
    trainer = PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"), mesh=mesh)
    ranks = TrainerRanks(trainer)
    initial = trainer.engine_weights()
    result = trainer.gradients(shard)
    grads = {
        name: whole_tensor(p.grad).clone()
        for name, p in trainer.model.named_parameters()
        if p.grad is not None
    }
    outcome = trainer.step(shard)
    adapter = trainer.engine_weights()
    merged = trainer.model_state()
    training = trainer.state_dict()
    if rank == 0:
        checkpoint_of(trainer.model, merged, training, out / "ckpt", ranks.adapter_checkpoint())
    dist.barrier()

    # A sharded trainer resumed from that checkpoint: rank 0 reads and leads, rank 1 follows.
    torch.manual_seed(10 + rank)
    resumed = PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"), mesh=mesh)
    if rank == 0:
        leader = TrainerRanks(resumed)
        checkpoint = read_checkpoint(out / "ckpt")
        leader.load(checkpoint.weights, checkpoint.training_state, out / "ckpt")
        leader.stop()
    else:
        follow(resumed)
    torch.save(
        {
            "loss": result.loss.loss,
            "grads": grads,
            "grad_norm": outcome.grad_norm,
            "initial": initial,
            "adapter": adapter,
            "merged": merged,
            "resumed": resumed.engine_weights(),
            "trained_parameters": [
                n for n, p in trainer.model.named_parameters() if p.requires_grad
            ],
        },
        out / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
