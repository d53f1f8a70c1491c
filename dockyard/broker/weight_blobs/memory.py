"""Blobs for the in-memory plane (one process): a dict, with the same verification.

The dict belongs to the plane (``MemoryPlane.weight_blobs``), as a JetStream plane's blobs live
in the broker: every role of the process makes its own store over the one plane (its own
leases, its own reader id) and they all see the blobs the trainer puts."""

from __future__ import annotations

from dockyard.broker.weight_blobs.base import (
    DIGEST_PREFIX,
    BlobNotFound,
    BlobRef,
    BlobSource,
    WeightBlobStore,
    check_digest,
    digest_of_bytes,
    new_ref,
    source_to_bytes,
)
from dockyard.broker.weight_blobs.leases import BlobLeases


class MemoryBlobStore(WeightBlobStore):
    def __init__(
        self,
        *,
        keep_last: int,
        grace_s: float,
        leases: BlobLeases | None = None,
        blobs: dict[str, tuple[BlobRef, bytes]] | None = None,
    ) -> None:
        """``blobs``: the shared bucket (digest -> ref, bytes); a private one when None."""
        super().__init__(keep_last=keep_last, grace_s=grace_s, leases=leases)
        self._blobs: dict[str, tuple[BlobRef, bytes]] = {} if blobs is None else blobs

    def uri_for(self, hex_digest: str) -> str:
        return f"memory://{DIGEST_PREFIX}{hex_digest}"

    async def put(self, version: int, source: BlobSource) -> BlobRef:
        data = source_to_bytes(source)
        digest = digest_of_bytes(data)
        ref = new_ref(version, digest, len(data), self.uri_for(digest.removeprefix(DIGEST_PREFIX)))
        self._blobs.setdefault(digest, (ref, data))
        return self._blobs[digest][0]

    async def _read_bytes(self, ref: BlobRef) -> bytes:
        try:
            _, data = self._blobs[ref.digest]
        except KeyError:
            raise BlobNotFound(f"no blob {ref.digest}") from None
        check_digest(ref.digest, digest_of_bytes(data), ref.uri)
        return data

    async def refs(self) -> list[BlobRef]:
        return sorted((ref for ref, _ in self._blobs.values()), key=lambda r: r.version)

    async def delete(self, ref: BlobRef) -> None:
        self._blobs.pop(ref.digest, None)
