"""The spec's import path for the run's config (``from dockyard.algorithms.grpo import
MasterConfig``), and the names this package registers for config keys.

``MasterConfig`` is defined in :mod:`dockyard.config.master`: ``config`` imports no other dockyard
package, so the rule that ``grpo.adv_estimator.name`` is a registered estimator takes the
registry from here, where both are known (:func:`registered_names`, passed to the loader).
"""

from __future__ import annotations

from dockyard.algorithms.advantages import estimator_names
from dockyard.config.master import MasterConfig, RegisteredNames
from dockyard.config.sections.cluster import ClusterConfig
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.config.sections.grpo import GRPOConfig
from dockyard.config.sections.loss import ClippedPGLossConfig

__all__ = [
    "ClippedPGLossConfig",
    "ClusterConfig",
    "DataPlaneConfig",
    "GRPOConfig",
    "MasterConfig",
    "registered_names",
]


def registered_names() -> RegisteredNames:
    """What the algorithms' registries hold now (a plug-in registered on import counts)."""
    return RegisteredNames(advantage_estimators=estimator_names())
