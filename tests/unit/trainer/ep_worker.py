"""The ranks of the expert-parallel check (run by test_expert_parallel.py under torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/ep_worker.py OUT_DIR   (or 4)

Both ranks form one expert-parallel group (a ``(1, 2)`` ``("dp_mod_ep", "ep")`` mesh) over the
tiny Qwen3-MoE (4 experts per layer: two on each rank). Each rank is also a data-parallel rank:

1. Every rank takes its share of the batch's prompt groups and runs ``PolicyTrainer.gradients``,
   for each layout of :data:`LAYOUTS`; it writes ``OUT_DIR/<layout>_rank<r>.pt``: its share's
   loss and prev log-probs, and the whole gradients.
2. Then as ``dockyard trainer`` runs them (rank 0 leads through :class:`TrainerRanks`, rank 1
   follows), rank 0 writes ``OUT_DIR/sharded.pt`` (the weight event's digest, the merged step
   outcome, the weights and optimizer moments after the step, and after loading
   ``OUT_DIR/single_ckpt``) and the checkpoint ``OUT_DIR/sharded_ckpt``.

Four ranks: a ``(2, 2)`` mesh, two replicas of each expert group, one prompt group per rank
(:data:`FOUR_GROUPS`); each rank writes ``OUT_DIR/four_rank<r>.pt``: its share's loss, the whole
gradients, and the grad norm and whole parameters after one ``step``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.expert_parallel import ShardedExperts
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import TrainerRanks, World, follow, join_ranks, leave_ranks
from tests.unit.trainer.cp_worker import DYNAMIC
from tests.unit.trainer.ranks_check import lead_step_and_resume
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch
from tests.unit.trainer.tp_worker import PACKED, whole

EP2 = ["policy.dtensor_cfg.expert_parallel_size=2"]
MOE = "qwen3_moe"
#: Micro-batch layouts whose loss and gradients equal the padded ones (test_packing.py), and
#: activation checkpointing (each layer's token exchange re-run in backward).
LAYOUTS = {
    "padded": [],
    "packed": PACKED,
    "dynamic": DYNAMIC,
    "checkpointed": ["policy.dtensor_cfg.activation_checkpointing=true"],
}


def trainer_on(mesh, layout: list[str]) -> PolicyTrainer:
    config = load_config("configs/quickstart.yaml", BASE + layout + EP2)
    return PolicyTrainer(tiny_model(MOE), config, torch.device("cpu"), mesh=mesh)


#: Prompt groups of the four-rank check: one per rank.
FOUR_GROUPS = 4


def main() -> None:
    out = Path(sys.argv[1])
    world = World.from_environment()
    mesh = join_ranks(world, expert_parallel=2)
    assert mesh is not None and mesh.mesh_dim_names == ("dp_mod_ep", "ep")
    if world.size == 4:
        replicas(mesh, out)
        leave_ranks()
        return
    batch = on_policy(varied_batch(), MOE)

    share = shard_by_groups(batch, dist.get_rank(), world.size)
    for name, layout in LAYOUTS.items():
        trainer = trainer_on(mesh, layout)
        experts = [m for m in trainer.model.modules() if isinstance(m, ShardedExperts)]
        result = trainer.gradients(share)
        torch.save(
            {
                "loss": result.loss.loss,
                "prev": result.prev_logprobs,
                "rows": share.size,
                "grads": whole((n, p.grad) for n, p in trainer.model.named_parameters()),
                "local_experts": [tuple(m.gate_up_proj.to_local().shape) for m in experts],
            },
            out / f"{name}_rank{dist.get_rank()}.pt",
        )

    trainer = trainer_on(mesh, [])
    if world.rank != 0:
        follow(trainer)
        leave_ranks()
        return
    ranks = TrainerRanks(trainer)
    initial_digest = digest_of_bytes(tensors_to_bytes(ranks.engine_weights()))
    lead_step_and_resume(ranks, batch, out, initial_digest=initial_digest)
    leave_ranks()


def replicas(mesh, out: Path) -> None:
    batch = on_policy(varied_batch(count=FOUR_GROUPS), MOE)
    share = shard_by_groups(batch, dist.get_rank(), mesh.size())
    trainer = trainer_on(mesh, [])
    result = trainer.gradients(share)
    grads = whole((n, p.grad) for n, p in trainer.model.named_parameters())
    outcome = trainer.step(share)
    torch.save(
        {
            "loss": result.loss.loss,
            "grads": grads,
            "grad_norm": outcome.grad_norm,
            "params": whole(trainer.model.named_parameters()),
        },
        out / f"four_rank{dist.get_rank()}.pt",
    )


if __name__ == "__main__":
    main()
