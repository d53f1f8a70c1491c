"""One rank of the FSDP2 data-parallel check (run by test_data_parallel.py under torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/dp_worker.py OUT_DIR

For each layout, writes ``OUT_DIR/<layout>-rank<r>.pt``: the loss metrics and the whole
(gathered) gradients of ``PolicyTrainer.gradients`` on this rank's groups, then the grad norm and
whole parameters after one ``step``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.test_packing import BASE, LAYOUTS, on_policy, tiny_model, varied_batch

#: Settings that change how the sharded step runs, not what it computes: compared with the
#: single-process padded layout.
SHARDED_ONLY = {
    "offload_checkpointed": [
        "policy.dtensor_cfg.cpu_offload=true",
        "policy.dtensor_cfg.activation_checkpointing=true",
    ]
}


def whole(tensors) -> dict[str, torch.Tensor]:
    return {name: t.full_tensor().detach().clone() for name, t in tensors}


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    batch = on_policy(varied_batch(), "qwen2")
    shard = shard_by_groups(batch, rank, world)
    for name, layout in {**LAYOUTS, **SHARDED_ONLY}.items():
        config = load_config("configs/quickstart.yaml", BASE + layout)
        model = tiny_model("qwen2")
        trainer = PolicyTrainer(model, config, torch.device("cpu"), mesh=mesh)
        result = trainer.gradients(shard)
        grads = whole((n, p.grad) for n, p in model.named_parameters())
        outcome = trainer.step(shard)
        params = whole(model.named_parameters())
        torch.save(
            {
                "loss": result.loss.loss,
                "num_valid_tokens": result.loss.num_valid_tokens,
                "samples": shard.size,
                "grads": grads,
                "grad_norm": outcome.grad_norm,
                "params": params,
                "offload": type(
                    model.model.layers[0]._get_fsdp_state()._fsdp_param_group.offload_policy
                ).__name__,
            },
            out / f"{name}-rank{rank}.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
