"""Advantage estimators, selected by ``grpo.adv_estimator.name`` from a registry.

``estimator_names()`` lists them (``grpo``, ``reinforce_plus_plus``, ``gdpo``, ``opd``) without
importing torch; ``build_estimator(grpo_cfg, loss_cfg).compute(AdvantageInputs(...))`` computes
``[B, T]`` advantages, and :func:`compute_advantages` adds the post-processing of a GRPO step
(KL-in-reward, advantage clipping, invalid-output overrides).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dockyard.algorithms.advantages import estimators as _builtin_estimators  # noqa: F401
from dockyard.algorithms.advantages.registry import (
    AdvantageEstimator,
    AdvantageInputs,
    EstimatorSettings,
    build_estimator,
    estimator_class,
    estimator_names,
    register_estimator,
)

if TYPE_CHECKING:
    from dockyard.algorithms.advantages.pipeline import AdvantageOverrides, compute_advantages

__all__ = [
    "AdvantageEstimator",
    "AdvantageInputs",
    "AdvantageOverrides",
    "EstimatorSettings",
    "build_estimator",
    "compute_advantages",
    "estimator_class",
    "estimator_names",
    "register_estimator",
]


def __getattr__(name: str) -> Any:
    # The pipeline imports torch; load it on first use so config validation stays light.
    if name in ("AdvantageOverrides", "compute_advantages"):
        from dockyard.algorithms.advantages import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
