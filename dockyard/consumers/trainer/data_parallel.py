"""FSDP2 data parallelism for :class:`PolicyTrainer` (``torch.distributed.fsdp.fully_shard``).

Each rank holds a shard of every parameter (and of its gradient and optimizer state) and trains
on its own share of the step's batch: whole prompt groups (:func:`shard_by_groups`), so
group-relative advantages are computed exactly as in one process. The loss of each rank is
normalised by the counts of the *whole* batch (:func:`global_counts`, an all-reduce), and
gradients must be *summed* across ranks: FSDP2 averages them (its divide factor 1 needs the
``PREMUL_SUM`` reduction, which gloo lacks), so each rank's loss is multiplied by the world size
(:func:`gradient_scale`). The step then equals the single-process one.

FSDP2 runs collectives in every forward (parameter all-gather) and backward (gradient
reduce-scatter), so every rank must run the same number of passes: :func:`pad_plans` appends
zero-weight passes to the ranks with fewer micro-batches.

Launched with ``torchrun``; the backend is NCCL on GPUs and gloo on the CPU. How ``dockyard
trainer`` runs its ranks (rank 0 leads, the others follow): :mod:`.ranks`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from dockyard.algorithms.loss import GlobalCounts
from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.micro_batches import MicroBatch


def shard_policy(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    *,
    cpu_offload: bool = False,
    ignored: set[torch.nn.Parameter] | None = None,
) -> torch.nn.Module:
    """Shard each decoder layer, then the rest (embeddings, final norm, head) at the root.

    ``cpu_offload`` (``policy.dtensor_cfg.cpu_offload``): FSDP2's ``CPUOffloadPolicy`` — the
    shards, their gradients and the optimizer state live in CPU memory, copied to the GPU for
    each layer's forward and backward (and the optimizer steps on the CPU). On a CPU mesh the
    shards are on the CPU anyway: the policy changes nothing there but runs its path."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no .model.layers: FSDP2 wrapping here knows the "
            "Hugging Face decoder-only layout (Qwen2, Llama, ...)"
        )
    offload = (
        CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if cpu_offload else OffloadPolicy()
    )
    for layer in layers:
        fully_shard(layer, mesh=mesh, offload_policy=offload, ignored_params=ignored)
    fully_shard(model, mesh=mesh, offload_policy=offload, ignored_params=ignored)
    return model


def broadcast_from_first_rank(model: torch.nn.Module, containing: str = "") -> None:
    """Every rank starts from rank 0's weights: ranks that each loaded or initialised the model
    could differ (a random initialisation, a file changed between reads). ``containing``: only
    the tensors whose name contains it (LoRA's adapters, initialised at random on each rank)."""
    for name, tensor in model.state_dict().items():
        if containing in name:
            dist.broadcast(tensor, src=0)


def gradient_scale(mesh: DeviceMesh | None) -> float:
    """What a rank's loss is multiplied by before backward so FSDP2's average is the sum."""
    return float(mesh.size()) if mesh is not None else 1.0


def shard_by_groups(batch: TrainingBatch, rank: int, world_size: int) -> TrainingBatch:
    """The contiguous run of whole prompt groups that ``rank`` trains on."""
    starts = [0] + [i for i in range(1, batch.size) if batch.group_ids[i] != batch.group_ids[i - 1]]
    if len(starts) < world_size:
        raise ValueError(
            f"{len(starts)} prompt groups cannot be shared by {world_size} data-parallel ranks"
        )
    bounds = [*starts, batch.size]
    first = rank * len(starts) // world_size
    last = (rank + 1) * len(starts) // world_size
    return batch.slice(bounds[first], bounds[last])


def global_counts(local: GlobalCounts, device: torch.device, mesh: DeviceMesh) -> GlobalCounts:
    values = torch.tensor(
        [local.valid_tokens, local.valid_sequences, local.positive_tokens],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(values, group=mesh.get_group())
    return GlobalCounts(*(float(v) for v in values.tolist()))


def pad_plans(
    plans: list[MicroBatch], device: torch.device, mesh: DeviceMesh
) -> list[MicroBatch | None]:
    """``plans`` and ``None`` (a zero-weight pass) up to the largest count of any rank."""
    count = torch.tensor([len(plans)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=mesh.get_group())
    return [*plans, *([None] * (int(count.item()) - len(plans)))]
