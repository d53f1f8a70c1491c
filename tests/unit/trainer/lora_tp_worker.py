"""The ranks of the LoRA tensor-parallel check (run by test_lora_tensor_parallel.py under
torchrun).

    torchrun --nproc_per_node 2 tests/unit/trainer/lora_tp_worker.py OUT_DIR

(With 4 processes: see :func:`two_groups`.)

Both ranks form one tensor-parallel group (a ``(1, 2)`` ``("dp", "tp")`` mesh) over a peft model
whose every decoder projection carries an adapter, and see the whole batch. Each rank seeds its
RNG differently before peft draws the adapters' initial ``A``: rank 0's must reach every rank.
For each layout each rank writes ``OUT_DIR/<layout>-rank<r>.pt``: the weight event before and
after two steps (and the digest of its bytes), each step's loss, adapters' whole gradients and
grad norm, the adapters' whole parameters after the steps, and what tensor-parallel trainers resumed
from two checkpoints publish: the one rank 0 wrote after the steps (``OUT_DIR/<layout>-ckpt``) and
the one-process checkpoint the test wrote beforehand (``OUT_DIR/single-ckpt``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.data_parallel import shard_by_groups
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, whole_tensor
from dockyard.consumers.trainer.ranks import (
    TrainerRanks,
    World,
    follow,
    join_ranks,
    leave_ranks,
)
from dockyard.consumers.trainer.trainer_checkpoint import read_checkpoint
from tests.unit.trainer.ranks_check import checkpoint_of
from tests.unit.trainer.test_packing import BASE, on_policy, tiny_model, varied_batch

TP2 = ["policy.dtensor_cfg.tensor_parallel_size=2"]
SP = ["policy.dtensor_cfg.sequence_parallel=true"]
# Every projection the tensor-parallel plan splits: column- and row-parallel ones.
LORA_ALL = [
    "policy.dtensor_cfg.lora_cfg.enabled=true",
    "policy.dtensor_cfg.lora_cfg.rank=4",
    "policy.dtensor_cfg.lora_cfg.alpha=8",
    "policy.dtensor_cfg.lora_cfg.target_modules="
    "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    "policy.optimizer.lr=0.01",
    # AdamW's first step is lr·g/(|g|+eps): with the default eps (1e-8) float noise in a
    # gradient near eps moves it by up to lr, and the second step's gradients would compare two
    # different points. eps=1e-3 keeps the step a smooth function of g.
    "policy.optimizer.eps=1e-3",
]
#: B starts at zero, so A's gradient is zero in the first step: the second checks it.
STEPS = 2
LAYOUTS = {"plain": [], "sp": SP}


def resumed_from(directory: Path, config, mesh, rank: int) -> dict[str, torch.Tensor]:
    """The weight event of a tensor-parallel trainer resumed from ``directory`` (rank 0 reads and
    leads, the other rank follows), seeded apart so that only the checkpoint can agree."""
    torch.manual_seed(10 + rank)
    resumed = PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"), mesh=mesh)
    if rank == 0:
        leader = TrainerRanks(resumed)
        checkpoint = read_checkpoint(directory)
        leader.load(checkpoint.weights, checkpoint.training_state, directory)
        leader.stop()
    else:
        follow(resumed)
    return resumed.engine_weights()


def train(
    config, mesh, batch, rank: int
) -> tuple[PolicyTrainer, dict[str, torch.Tensor], list[dict]]:
    """A trainer seeded by ``rank``, its first weight event, and :data:`STEPS` steps on
    ``batch``: each one's loss, whole adapter gradients and grad norm."""
    torch.manual_seed(rank)  # a different adapter initialisation on each rank
    trainer = PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"), mesh=mesh)
    # Cloned: a whole A is the parameter itself (detached), which the steps change.
    initial = {n: t.clone() for n, t in trainer.engine_weights().items()}
    steps = []
    for _ in range(STEPS):
        result = trainer.gradients(batch)
        grads = {
            n: whole_tensor(p.grad).clone()
            for n, p in trainer.model.named_parameters()
            if p.grad is not None
        }
        outcome = trainer.step(batch)
        steps.append({"loss": result.loss.loss, "grads": grads, "grad_norm": outcome.grad_norm})
    return trainer, initial, steps


def lora_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: whole_tensor(p).clone() for n, p in model.named_parameters() if ".lora_" in n}


def two_groups(out: Path, mesh, rank: int) -> None:
    """Four ranks: FSDP2 over two data-parallel groups of two tensor-parallel ranks (sequence
    parallel), each group on its share of the prompt groups (as TrainerRanks scatters them)."""
    batch = shard_by_groups(on_policy(varied_batch(), "qwen2"), mesh.get_coordinate()[0], 2)
    config = load_config("configs/quickstart.yaml", BASE + LORA_ALL + TP2 + SP)
    trainer, initial, steps = train(config, mesh, batch, rank)
    adapter = trainer.engine_weights()
    torch.save(
        {
            "initial": initial,
            "steps": steps,
            "digest": digest_of_bytes(tensors_to_bytes(adapter)),
            "params": lora_params(trainer.model),
        },
        out / f"fsdp-rank{rank}.pt",
    )


def main() -> None:
    out = Path(sys.argv[1])
    mesh = join_ranks(World.from_environment(), tensor_parallel=2)
    assert mesh is not None and mesh.ndim == 2
    rank = dist.get_rank()
    if mesh.size(0) > 1:
        two_groups(out, mesh, rank)
        leave_ranks()
        return
    batch = on_policy(varied_batch(), "qwen2")
    for name, layout in LAYOUTS.items():
        config = load_config("configs/quickstart.yaml", BASE + LORA_ALL + TP2 + layout)
        trainer, initial, steps = train(config, mesh, batch, rank)
        model = trainer.model
        adapter = trainer.engine_weights()
        params = lora_params(model)
        merged = trainer.model_state()
        training = trainer.state_dict()
        ckpt = out / f"{name}-ckpt"
        if rank == 0:
            checkpoint_of(model, merged, training, ckpt, TrainerRanks(trainer).adapter_checkpoint())
        dist.barrier()
        q_proj = model.model.layers[0].self_attn.q_proj
        down_proj = model.model.layers[0].mlp.down_proj
        torch.save(
            {
                "initial": initial,
                "initial_digest": digest_of_bytes(tensors_to_bytes(initial)),
                "steps": steps,
                "adapter": adapter,
                "digest": digest_of_bytes(tensors_to_bytes(adapter)),
                "params": params,
                # The plan reached peft's layers: W and B split in q_proj, W and A in down_proj.
                "split": [
                    isinstance(t, DTensor)
                    for t in (
                        q_proj.base_layer.weight,
                        q_proj.lora_B["default"].weight,
                        q_proj.lora_A["default"].weight,
                        down_proj.base_layer.weight,
                        down_proj.lora_A["default"].weight,
                        down_proj.lora_B["default"].weight,
                    )
                ],
                "resumed": resumed_from(ckpt, config, mesh, rank),
                "from_single": resumed_from(out / "single-ckpt", config, mesh, rank),
            },
            out / f"{name}-rank{rank}.pt",
        )
    leave_ranks()


if __name__ == "__main__":
    main()
