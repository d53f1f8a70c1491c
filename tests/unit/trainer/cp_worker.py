"""The ranks of the context-parallel check (run by test_context_parallel.py under torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/cp_worker.py OUT_DIR   (or 4)

Both ranks form one context-parallel group (a ``(1, 2)`` ``("dp", "cp")`` mesh), see the whole
batch and each run the model on half of every sequence's positions. For each layout
(:data:`LAYOUTS`) rank ``r`` writes ``OUT_DIR/<layout>_rank<r>_of<N>.pt``: the loss and prev
log-probs of ``PolicyTrainer.gradients``, the whole gradients, and the grad norm and whole
parameters after one ``step``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import World, join_ranks, leave_ranks
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch
from tests.unit.trainer.tp_worker import whole

CP2 = ["policy.dtensor_cfg.context_parallel_size=2"]
DYNAMIC = [
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=32",
    "policy.dynamic_batching.logprob_mb_tokens=48",
    "policy.dynamic_batching.sequence_length_round=4",
]
#: name: (architecture, overrides). Llama: the other family the attention is registered for
#: (no q/k/v biases, different rotary defaults).
LAYOUTS = {"padded": ("qwen2", []), "dynamic": ("qwen2", DYNAMIC), "llama": ("llama", [])}


def main() -> None:
    out = Path(sys.argv[1])
    world = World.from_environment()
    mesh = join_ranks(world, context_parallel=2)
    assert mesh is not None and mesh.mesh_dim_names == ("dp", "cp")
    data_ranks = mesh.size(0)
    # Four ranks: two data-parallel groups of two cp ranks, each group on its share of the
    # prompt groups (as TrainerRanks scatters them); the fixed layout only.
    layouts = LAYOUTS if data_ranks == 1 else {"padded": LAYOUTS["padded"]}
    for name, (arch, layout) in layouts.items():
        batch = on_policy(varied_batch(), arch)
        batch = shard_by_groups(batch, mesh.get_coordinate()[0], data_ranks)
        config = load_config("configs/quickstart.yaml", BASE + layout + CP2)
        model = tiny_model(arch)
        trainer = PolicyTrainer(model, config, torch.device("cpu"), mesh=mesh)
        result = trainer.gradients(batch)
        grads = whole((n, p.grad) for n, p in model.named_parameters())
        outcome = trainer.step(batch)
        params = whole(model.named_parameters())
        torch.save(
            {
                "loss": result.loss.loss,
                "prev": result.prev_logprobs,
                "grads": grads,
                "grad_norm": outcome.grad_norm,
                "params": params,
                "attention": model.config._attn_implementation,
            },
            out / f"{name}_rank{dist.get_rank()}_of{world.size}.pt",
        )
    leave_ranks()


if __name__ == "__main__":
    main()
