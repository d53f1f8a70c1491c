"""``cluster``: the cluster shape (:class:`ClusterConfig`)."""

from __future__ import annotations

from pydantic import NonNegativeInt, PositiveInt

from dockyard.config.base import Section


class ClusterConfig(Section):
    gpus_per_node: NonNegativeInt = 0
    num_nodes: PositiveInt = 1

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes
