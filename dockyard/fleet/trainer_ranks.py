"""How many trainer processes (ranks) a run has, checked against ``cluster`` and the machine.

``cluster.gpus_per_node = G > 0`` asks for G GPUs on each of ``cluster.num_nodes`` nodes, one
trainer rank per GPU: ``dockyard run`` (one machine) starts G ranks under ``torchrun``; under a
``torchrun`` you start yourself (any number of nodes) ``dockyard trainer`` checks that torchrun
started G ranks per node, G × num_nodes in all, and that torch sees G GPUs. A GPU count on a
machine where torch sees no GPU is refused, never run on the CPU instead.

``cluster.gpus_per_node = 0`` (the default) declares no GPUs: ``dockyard run`` starts one trainer
process, or ``--trainer-ranks N`` CPU ranks (gloo); ``dockyard trainer`` runs as many ranks as
torchrun started. On a CPU machine ranks are processes that split the batch and the model's
memory; they add no cores (give each its own with ``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dockyard.config.sections.cluster import ClusterConfig

if TYPE_CHECKING:
    from dockyard.config.master import MasterConfig


@dataclass(frozen=True)
class LaunchRefused(ValueError):
    """What asks for ranks cannot be met here: ``key`` (a config path or option) and why."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


def ranks_for_run(cluster: ClusterConfig, *, requested: int | None, cuda_devices: int) -> int:
    """The trainer ranks ``dockyard run`` starts on this machine (``requested``:
    ``--trainer-ranks``)."""
    gpus = cluster.gpus_per_node
    if cluster.num_nodes > 1:
        raise LaunchRefused(
            "cluster.num_nodes",
            f"{cluster.num_nodes} nodes: `dockyard run` starts the roles of one machine; start "
            "`dockyard trainer` under torchrun on each node instead (docs/trainer.md)",
        )
    if requested is not None and requested < 1:
        raise LaunchRefused("--trainer-ranks", f"{requested}: at least one rank")
    if gpus == 0:
        return requested or 1
    _check_gpus(gpus, cuda_devices)
    if requested is not None and requested != gpus:
        raise LaunchRefused(
            "--trainer-ranks",
            f"{requested} contradicts cluster.gpus_per_node={gpus} (one rank per GPU); "
            "leave one of them out",
        )
    return gpus


def check_torchrun_world(
    cluster: ClusterConfig, *, world_size: int, local_world_size: int, cuda_devices: int
) -> None:
    """``dockyard trainer`` under torchrun (or alone: a world of one): refuse a world that is
    not the one ``cluster`` asks for."""
    gpus = cluster.gpus_per_node
    if gpus == 0:
        if cluster.num_nodes > 1:
            raise LaunchRefused(
                "cluster.num_nodes",
                f"{cluster.num_nodes} nodes with cluster.gpus_per_node=0: set the GPUs per node",
            )
        return
    _check_gpus(gpus, cuda_devices)
    expected = gpus * cluster.num_nodes
    if local_world_size != gpus or world_size != expected:
        raise LaunchRefused(
            "cluster.gpus_per_node",
            f"cluster asks for {gpus} ranks on each of {cluster.num_nodes} node(s) ({expected} in "
            f"all) but {world_size} rank(s) run, {local_world_size} on this node: start it with "
            f"torchrun --nnodes {cluster.num_nodes} --nproc_per_node {gpus}",
        )


def check_ranks_can_run(config: MasterConfig, world_size: int) -> None:
    """What needs several ranks, or only runs in one, refused before any rank starts."""
    dtensor = config.policy.dtensor_cfg
    tensor = dtensor.tensor_parallel_size
    if world_size % tensor:
        raise LaunchRefused(
            "policy.dtensor_cfg.tensor_parallel_size",
            f"{tensor} must divide the {world_size} trainer rank(s)",
        )
    context = dtensor.context_parallel_size
    if world_size % (tensor * context):
        raise LaunchRefused(
            "policy.dtensor_cfg.context_parallel_size",
            f"tensor × context parallel = {tensor} × {context} must divide the {world_size} "
            "trainer rank(s)",
        )
    expert = dtensor.expert_parallel_size
    if world_size % expert:
        raise LaunchRefused(
            "policy.dtensor_cfg.expert_parallel_size",
            f"{expert} must divide the {world_size} trainer rank(s) (the ep ranks are "
            "data-parallel ranks)",
        )
    if world_size // tensor == 1 and dtensor.enabled and dtensor.cpu_offload:
        raise LaunchRefused(
            "policy.dtensor_cfg.cpu_offload",
            "offloads FSDP2 shards to the CPU, and without data-parallel ranks nothing is "
            "sharded: start more ranks (cluster.gpus_per_node, --trainer-ranks, torchrun) than "
            "tensor_parallel_size, or set it false",
        )
    sft = config.sft
    if world_size > 1 and sft is not None and sft.enabled and sft.max_num_steps > 0:
        raise LaunchRefused(
            "sft.enabled",
            f"the supervised warm start runs in one process; with {world_size} trainer ranks "
            "set it false (or warm-start once in one process and train from its checkpoint)",
        )


def _check_gpus(gpus: int, cuda_devices: int) -> None:
    if cuda_devices == 0:
        raise LaunchRefused(
            "cluster.gpus_per_node",
            f"{gpus} GPUs asked for but torch sees no CUDA GPU on this machine; for CPU ranks "
            "set it to 0 and use `dockyard run --trainer-ranks N` or torchrun (docs/trainer.md)",
        )
    if cuda_devices < gpus:
        raise LaunchRefused(
            "cluster.gpus_per_node",
            f"{gpus} GPUs asked for but torch sees {cuda_devices} on this machine",
        )


def torchrun_argv(ranks: int, dockyard_args: list[str]) -> list[str]:
    """``python -m dockyard ARGS`` as ``ranks`` processes on this machine, under torchrun
    (``--standalone``: a rendezvous on a free local port, so runs side by side never meet)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        "-m",
        "dockyard",
        *dockyard_args,
    ]


def check_jax_devices(config: MasterConfig) -> None:
    """``policy.jax_cfg`` asks for ``data_parallel_size × tensor_parallel_size`` devices: refused
    before any process starts when JAX is missing or sees fewer (JAX is imported only then)."""
    if not config.policy.jax_cfg.enabled:
        return
    try:
        import jax
    except ImportError:
        raise LaunchRefused(
            "policy.jax_cfg.enabled", "JAX is not installed: pip install 'dockyard[jax]'"
        ) from None
    from dockyard.consumers.trainer.jax_backend.mesh import check_device_count

    try:
        check_device_count(config.policy.jax_cfg, jax.devices())
    except ValueError as refused:
        raise LaunchRefused("policy.jax_cfg.data_parallel_size", str(refused)) from None
