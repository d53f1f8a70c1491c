"""The operator's side of the data plane: provisioning, purges and stream statistics.

Roles (``producers/``, ``consumers/``) get a :class:`~dockyard.broker.plane.DataPlane`: publish,
pull and settle, dead letters, reading history (a trainer resumes from it) and following weight
events. What changes or surveys the broker itself — creating streams and consumers, deleting
stored messages, listing every stream with its consumers' lag — is declared here, in
:class:`AdminPlane`, and only ``commands/``, the status and dashboard code (``fleet/``) and the
broker's own blob housekeeping use it: ``tests/unit/test_layering.py`` refuses an import of this
module from ``producers/`` or ``consumers/``.

Both implementations (:class:`~dockyard.broker.jetstream.JetStreamPlane`,
:class:`~dockyard.broker.memory.MemoryPlane`) are admin planes: the operations share their
connection and state. The stream and consumer definitions stay in :mod:`.names` and
:mod:`.provisioning`, which this module only names.
"""

from __future__ import annotations

import abc
from pathlib import Path

from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import DataPlane, ProvisionReport, StreamState
from dockyard.broker.provisioning import consumer_config, stream_config

__all__ = [
    "AdminPlane",
    "ProvisionReport",
    "StreamState",
    "as_admin",
    "consumer_config",
    "stream_config",
    "stream_state",
]


class AdminPlane(DataPlane):
    """A data plane with the operations that provision, purge and survey the broker."""

    @abc.abstractmethod
    async def provision(
        self, *, update_limits: bool = False, local_store: Path | None = None
    ) -> ProvisionReport:
        """Create every stream and durable consumer missing; idempotent. An existing stream
        keeps its limits (reported in ``kept``) unless ``update_limits``; ``local_store``: the
        server's store directory when it is on this machine, checked for room first."""

    @abc.abstractmethod
    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        """Create-or-update one durable consumer (for consumers beyond the standard ones)."""

    @abc.abstractmethod
    async def purge(self, subject: str) -> None:
        """Delete every stored message on ``subject`` (wildcards allowed) from its stream."""

    @abc.abstractmethod
    async def streams(self) -> list[StreamState]:
        """Every stream of this namespace with its sequence range, size and consumers' lag."""


def as_admin(plane: DataPlane) -> AdminPlane:
    """``plane`` as an admin plane, refusing one that cannot provision, purge or survey."""
    if not isinstance(plane, AdminPlane):
        raise TypeError(
            f"{type(plane).__name__} is not an admin plane: it cannot provision, purge or list "
            "streams"
        )
    return plane


async def stream_state(plane: AdminPlane, name: str) -> StreamState | None:
    """The state of one stream of ``plane``'s namespace, None when it does not exist."""
    return next((s for s in await plane.streams() if s.name == name), None)
