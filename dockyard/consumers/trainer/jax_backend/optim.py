"""``policy.optimizer`` / ``policy.scheduler`` / ``policy.max_grad_norm`` as an optax chain.

Each optimizer is the one the torch backend builds (:mod:`dockyard.consumers.trainer.optim`),
step for step: gradients clipped to ``max_grad_norm`` by their global norm first (as
``clip_grad_norm_`` before ``optimizer.step()``), then

- ``adamw``: Adam moments, then decoupled weight decay, times the learning rate
  (``p ← p − lr·(m̂/(√v̂+ε) + λ·p)``, torch's ``AdamW``);
- ``adam``: L2 decay added to the gradient before the moments (torch's ``Adam``);
- ``sgd``: L2 decay added to the gradient, times the learning rate (torch's ``SGD``).

The learning rate is a hyperparameter injected each step (``optax.inject_hyperparams``), set
from the torch backend's own schedule function (:func:`~dockyard.consumers.trainer.optim.
lr_multiplier`), so the schedule has one definition and changing it never recompiles the step.
"""

from __future__ import annotations

import optax

from dockyard.config.sections.policy import OptimizerConfig


def build_transform(
    config: OptimizerConfig, max_grad_norm: float | None
) -> optax.GradientTransformation:
    def chain(learning_rate: float) -> optax.GradientTransformation:
        parts: list[optax.GradientTransformation] = []
        if max_grad_norm is not None:
            parts.append(optax.clip_by_global_norm(max_grad_norm))
        b1, b2 = config.betas
        adam = optax.scale_by_adam(b1=b1, b2=b2, eps=config.eps)
        decay = optax.add_decayed_weights(config.weight_decay)
        if config.name == "adamw":
            parts += [adam, decay]
        elif config.name == "adam":
            parts += [decay, adam]
        else:
            parts.append(decay)
        parts.append(optax.scale_by_learning_rate(learning_rate))
        return optax.chain(*parts)

    return optax.inject_hyperparams(chain)(learning_rate=config.lr)
