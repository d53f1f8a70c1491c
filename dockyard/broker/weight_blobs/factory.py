"""Pick the weight transport from ``data_plane.weight_transport``."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from dockyard.broker.admin import as_admin
from dockyard.broker.plane import DataPlane
from dockyard.broker.weight_blobs.base import WeightBlobStore
from dockyard.broker.weight_blobs.leases import BlobLeases


class _Retention(TypedDict):
    """The retention arguments every blob store takes."""

    keep_last: int
    grace_s: float
    leases: BlobLeases | None


def create_weight_store(plane: DataPlane, *, reader_id: str | None = None) -> WeightBlobStore:
    """The blob store a plane's config asks for (``jetstream`` on the in-memory plane = memory).

    Reads hold leases (over ``plane``) named after ``reader_id`` (default: host and pid), so
    retention never deletes a version while someone fetches it. Retention purges the lease
    records of a deleted version: blob housekeeping is the broker's, so the store gets the
    plane's admin side here, which the role that holds the store cannot reach.
    """
    from dockyard.broker.jetstream import JetStreamPlane

    transport = plane.config.weight_transport
    retention: _Retention = {
        "keep_last": transport.keep_last_versions,
        "grace_s": transport.retention_grace_s,
        "leases": BlobLeases(
            as_admin(plane), ttl_s=transport.reader_lease_ttl_s, reader_id=reader_id
        ),
    }
    if transport.kind == "filesystem":
        from dockyard.broker.weight_blobs.files import FilesystemBlobStore

        assert transport.path is not None  # enforced by the config rules
        return FilesystemBlobStore(Path(transport.path), **retention)
    if transport.kind == "http":
        from dockyard.broker.weight_blobs.files import HttpBlobStore

        assert transport.base_url is not None
        return HttpBlobStore(
            transport.base_url,
            Path(transport.path) if transport.path else None,
            timeout_s=transport.fetch_stall_timeout_s,
            **retention,
        )
    if isinstance(plane, JetStreamPlane):
        from dockyard.broker.weight_blobs.jetstream_blobs import JetStreamBlobStore

        return JetStreamBlobStore(
            plane,
            chunk_size=transport.chunk_size,
            stall_timeout_s=transport.fetch_stall_timeout_s,
            **retention,
        )
    from dockyard.broker.memory import MemoryPlane
    from dockyard.broker.weight_blobs.memory import MemoryBlobStore

    shared = plane.weight_blobs if isinstance(plane, MemoryPlane) else None
    return MemoryBlobStore(blobs=shared, **retention)
