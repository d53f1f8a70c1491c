"""The ranks of the tensor-parallel check (run by test_tensor_parallel.py under torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/tp_worker.py OUT_DIR

Both ranks form one tensor-parallel group (a ``(1, 2)`` ``("dp", "tp")`` mesh) and see the whole
batch. For each layout rank 0 writes ``OUT_DIR/<layout>.pt``: the loss metrics and whole gradients
of ``PolicyTrainer.gradients``, the blob digest of the gathered initial weights, and the grad
norm and whole parameters after one ``step``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.consumers.trainer.ranks import World, join_ranks, leave_ranks
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch

TP2 = ["policy.dtensor_cfg.tensor_parallel_size=2"]
PACKED = [
    "policy.sequence_packing.enabled=true",
    "policy.sequence_packing.train_mb_tokens=32",
    "policy.sequence_packing.logprob_mb_tokens=40",
]
SP = ["policy.dtensor_cfg.sequence_parallel=true"]
LAYOUTS = {"padded": [], "packed": PACKED, "padded_sp": SP, "packed_sp": PACKED + SP}


def whole(tensors) -> dict[str, torch.Tensor]:
    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
        for name, t in tensors
    }


def main() -> None:
    out = Path(sys.argv[1])
    mesh = join_ranks(World.from_environment(), tensor_parallel=2)
    assert mesh is not None and mesh.ndim == 2
    batch = on_policy(varied_batch(), "qwen2")
    for name, layout in LAYOUTS.items():
        config = load_config("configs/quickstart.yaml", BASE + layout + TP2)
        model = tiny_model("qwen2")
        trainer = PolicyTrainer(model, config, torch.device("cpu"), mesh=mesh)
        digest = digest_of_bytes(tensors_to_bytes(trainer.model_state()))
        result = trainer.gradients(batch)
        grads = whole((n, p.grad) for n, p in model.named_parameters())
        outcome = trainer.step(batch)
        params = whole(model.named_parameters())
        if dist.get_rank() == 0:
            torch.save(
                {
                    "loss": result.loss.loss,
                    "digest": digest,
                    "grads": grads,
                    "grad_norm": outcome.grad_norm,
                    "params": params,
                    "sharded": isinstance(model.model.layers[0].self_attn.q_proj.weight, DTensor),
                    # Sequence parallel: the norms hold replicated DTensors.
                    "norm_replicated": isinstance(
                        model.model.layers[0].input_layernorm.weight, DTensor
                    ),
                },
                out / f"{name}.pt",
            )
    leave_ranks()


if __name__ == "__main__":
    main()
