"""Which policy trainer the trainer loop drives: the torch one, or the JAX one
(``policy.jax_cfg.enabled``).

Both take the loaded torch policy and train it in place: the JAX trainer keeps the torch model as
the mirror of its parameters (see :mod:`.jax_backend.trainer`), so the loop publishes,
validates and checkpoints the same way under either. JAX is imported only here, only when
asked for: a torch-only install never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch.distributed.device_mesh import DeviceMesh

from dockyard.algorithms.grpo import MasterConfig
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, StepOutcome
from dockyard.models.vision import VisionProcessor

if TYPE_CHECKING:
    from peft import PeftModel

    from dockyard.consumers.trainer.batch import TrainingBatch

JAX_EXTRA = "pip install 'dockyard[jax]'"


class TrainerBackend(Protocol):
    """What the loop and :class:`~dockyard.consumers.trainer.ranks.TrainerRanks` use of a
    policy trainer. Read-only members: a backend may narrow them (the JAX one has no mesh)."""

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def mesh(self) -> DeviceMesh | None: ...
    @property
    def tensor_mesh(self) -> DeviceMesh | None: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def peft(self) -> PeftModel | None: ...

    def step(self, batch: TrainingBatch) -> StepOutcome: ...

    def batch_logprobs(self, model: torch.nn.Module, batch: TrainingBatch) -> torch.Tensor: ...

    def model_state(self) -> dict[str, torch.Tensor]: ...

    def engine_weights(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


def build_policy_trainer(
    model: torch.nn.Module,
    config: MasterConfig,
    *,
    mesh: DeviceMesh | None = None,
    processor: VisionProcessor | None = None,
) -> TrainerBackend:
    """``mesh``: the torchrun ranks' device mesh (torch only; the JAX backend shards over its
    own devices, ``policy.jax_cfg``). ``processor``: a vision-language policy's (torch only)."""
    if not config.policy.jax_cfg.enabled:
        return PolicyTrainer(model, config, mesh=mesh, processor=processor)
    if processor is not None:
        raise ValueError(
            "policy.jax_cfg.enabled with a vision-language policy: the JAX trainer's model has "
            "no vision tower, so image samples cannot be trained with it (use the torch trainer)"
        )
    if mesh is not None:
        raise ValueError(
            "policy.jax_cfg.enabled: the JAX trainer runs in one process over its own devices "
            "(policy.jax_cfg.data_parallel_size / tensor_parallel_size), not under torchrun"
        )
    try:
        from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer
    except ImportError as error:
        raise RuntimeError(
            f"policy.jax_cfg.enabled=true needs JAX, Flax and optax ({JAX_EXTRA}): {error}"
        ) from error
    return JaxPolicyTrainer(model, config)
