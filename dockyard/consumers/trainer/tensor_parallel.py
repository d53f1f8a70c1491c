"""Tensor parallelism for the Qwen2 / Llama family (``policy.dtensor_cfg.tensor_parallel_size``)
with DTensor's ``parallelize_module``.

The usual Megatron-style plan on each decoder layer: the q/k/v and gate/up projections are split
by output features (``ColwiseParallel``: each rank computes its heads, or its share of the MLP's
hidden units), o_proj and down_proj by input features (``RowwiseParallel``: the partial outputs
are summed by an all-reduce). Attention then runs on each rank's own heads: Transformers' Qwen2 /
Llama attention reshapes to ``(-1, head_dim)``, so it takes whatever number of heads its rank
holds. Embeddings, norms and the LM head stay whole on every rank.

Ranks form a 2-D mesh ``("dp", "tp")``: the ``tp`` ranks of one data-parallel group see the same
batch; FSDP2 shards over ``dp`` (:mod:`.data_parallel`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

DP, TP = "dp", "tp"

LAYER_PLAN: dict[str, type[ParallelStyle]] = {
    "self_attn.q_proj": ColwiseParallel,
    "self_attn.k_proj": ColwiseParallel,
    "self_attn.v_proj": ColwiseParallel,
    "self_attn.o_proj": RowwiseParallel,
    "mlp.gate_proj": ColwiseParallel,
    "mlp.up_proj": ColwiseParallel,
    "mlp.down_proj": RowwiseParallel,
}


def check_divisible(config: object, size: int) -> None:
    """Heads and MLP width must split evenly over ``size`` ranks."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name, None)
        if not isinstance(value, int) or value % size:
            raise ValueError(
                f"policy.dtensor_cfg.tensor_parallel_size={size} must divide the model's "
                f"{name} ({value})"
            )


def parallelize_policy(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Apply :data:`LAYER_PLAN` to every decoder layer over the 1-D ``mesh`` (the ``tp`` ranks)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__} has no .model.layers: the tensor-parallel plan here is for "
            "the Hugging Face decoder-only layout (Qwen2, Llama, ...)"
        )
    check_divisible(model.config, mesh.size())
    plan = {name: style() for name, style in LAYER_PLAN.items()}
    for layer in layers:
        parallelize_module(layer, mesh, plan)
    return model


def clip_mixed_gradients(
    parameters: Iterable[torch.nn.Parameter], max_norm: float | None
) -> torch.Tensor:
    """``clip_grad_norm_`` for gradients that are DTensors on different meshes and whole tensors
    (tensor parallelism leaves embeddings and norms whole): each gradient's norm is taken whole
    (a DTensor's by a reduction of the scalar), then the same total norm and clip coefficient as
    ``clip_grad_norm_``."""
    grads = [p.grad for p in parameters if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64)
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, 2)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares = squares + norm.detach().double().cpu() ** 2
    total = squares.sqrt()
    if max_norm is not None:
        coefficient = min(1.0, max_norm / (float(total) + 1e-6))
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
    return total
