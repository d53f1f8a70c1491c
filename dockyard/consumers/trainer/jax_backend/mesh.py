"""``policy.jax_cfg.data_parallel_size`` × ``tensor_parallel_size``: a ``jax.sharding`` mesh.

The mesh has axes ``("data", "model")``. Batches are split along ``data`` (each data-parallel
shard trains ``train_micro_batch_size`` rows per micro-batch, as a torch data-parallel rank
does); parameters are split along ``model`` Megatron-style — column-parallel q/k/v/gate/up
(output rows), row-parallel o/down (input columns), the embedding along the hidden size — and
replicated along ``data``. XLA's SPMD partitioner inserts the collectives (gradient all-reduce
over ``data``, activation reductions over ``model``), so the step computes the same numbers as
on one device. Optimizer state follows its parameter's sharding.

A size that does not fit is refused with its key path: more devices than JAX sees, or a
dimension the tensor-parallel size does not divide.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dockyard.config.sections.policy import JaxConfig

DATA, MODEL = "data", "model"

_COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW_PARALLEL = ("o_proj", "down_proj")


def check_device_count(config: JaxConfig, available: list[jax.Device]) -> None:
    """Refuses a mesh larger than the devices JAX sees (at launch and when the trainer builds
    its mesh)."""
    dp, tp = config.data_parallel_size, config.tensor_parallel_size
    wanted = dp * tp
    if wanted > len(available):
        raise ValueError(
            f"policy.jax_cfg: data_parallel_size × tensor_parallel_size = {dp} × {tp} = "
            f"{wanted} devices, but JAX sees {len(available)} "
            f"({available[0].platform if available else 'none'}); on CPU, "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={wanted} makes that many"
        )


def build_mesh(config: JaxConfig, devices: list[jax.Device] | None = None) -> Mesh | None:
    """The mesh of ``policy.jax_cfg``; None for one device (nothing to shard)."""
    dp, tp = config.data_parallel_size, config.tensor_parallel_size
    available = jax.devices() if devices is None else devices
    check_device_count(config, available)
    wanted = dp * tp
    if wanted == 1:
        return None
    return Mesh(np.asarray(available[:wanted]).reshape(dp, tp), (DATA, MODEL))


def parameter_spec(name: str, shape: tuple[int, ...], tp: int) -> PartitionSpec:
    """Where the parameter ``name`` (torch name) is split along ``model``; refuses a dimension
    ``tp`` does not divide."""
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    kind = name.rsplit(".", 1)[-1]
    axis: int | None = None
    if module in _COLUMN_PARALLEL:
        axis = 0  # weight [out, in] and bias [out]: split the outputs
    elif module in _ROW_PARALLEL and kind == "weight":
        axis = 1
    elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        axis = 1  # [vocab, hidden]: split the hidden size
    if axis is None or tp == 1:
        return PartitionSpec()  # type: ignore[no-untyped-call]  # jax leaves PartitionSpec.__init__ unannotated
    if shape[axis] % tp:
        raise ValueError(
            f"policy.jax_cfg.tensor_parallel_size={tp} does not divide dimension {axis} of "
            f"{name} {shape}"
        )
    spec: list[str | None] = [None] * len(shape)
    spec[axis] = MODEL
    return PartitionSpec(*spec)  # type: ignore[no-untyped-call]  # jax leaves PartitionSpec.__init__ unannotated


def parameter_sharding(mesh: Mesh, name: str, shape: tuple[int, ...]) -> NamedSharding:
    return NamedSharding(mesh, parameter_spec(name, shape, mesh.shape[MODEL]))


def batch_sharding(mesh: Mesh, rank: int) -> NamedSharding:
    """``[micro-batches, rows, ...]`` arrays: rows split along ``data``."""
    spec = PartitionSpec(None, DATA, *([None] * (rank - 2)))  # type: ignore[no-untyped-call]  # jax leaves PartitionSpec.__init__ unannotated
    return NamedSharding(mesh, spec)
