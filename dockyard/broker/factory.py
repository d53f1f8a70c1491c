"""``create_data_plane``: the one call a role makes to get its plane."""

from __future__ import annotations

from dockyard.broker.plane import DataPlane
from dockyard.config.sections.data_plane import DataPlaneConfig


def create_data_plane(
    config: DataPlaneConfig | None, *, client_name: str = "dockyard", provision: bool = True
) -> DataPlane:
    """JetStream for a ``data_plane`` section (``url: embedded`` starts a local server), the
    in-memory plane for ``None``. The in-memory plane lives in one process: every role of that
    process must share the one instance this returns."""
    if config is None:
        from dockyard.broker.memory import MemoryPlane

        return MemoryPlane()
    from dockyard.broker.jetstream import JetStreamPlane

    return JetStreamPlane(config, provision=provision, client_name=client_name)
