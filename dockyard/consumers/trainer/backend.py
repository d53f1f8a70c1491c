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

from dockyard.algorithms.grpo import MasterConfig
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, StepOutcome

if TYPE_CHECKING:
    from dockyard.consumers.trainer.batch import TrainingBatch

JAX_EXTRA = "pip install 'dockyard[jax]'"


class TrainerBackend(Protocol):
    """What the loop and the checkpoint code use of a policy trainer."""

    model: torch.nn.Module

    def step(self, batch: TrainingBatch) -> StepOutcome: ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state: dict[str, object]) -> None: ...


def build_policy_trainer(model: torch.nn.Module, config: MasterConfig) -> TrainerBackend:
    if not config.policy.jax_cfg.enabled:
        return PolicyTrainer(model, config)
    try:
        from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer
    except ImportError as error:
        raise RuntimeError(
            f"policy.jax_cfg.enabled=true needs JAX, Flax and optax ({JAX_EXTRA}): {error}"
        ) from error
    return JaxPolicyTrainer(model, config)
