"""Weight blobs as JetStream chunks, read chunk by chunk with direct gets.

Layout in stream ``<ns>_blobs``: the chunks of a blob on ``<ns>.blobs.<hex>.data`` (in order),
then its manifest (JSON: version, digest, nbytes, chunk count, chunk size, time) on
``<ns>.blobs.<hex>.meta``. The manifest goes last, so a manifest means a complete blob.

A put can die between its first chunk and its manifest (a trainer killed mid-publish); the same
version is then put again, perhaps long after the broker's duplicate window. So a put that finds
no manifest purges the data subject first (no reader reads chunks no manifest names), and each
put's chunks carry message ids of their own (``blob:<hex>:<write>:<index>``): the server keeps
a purged message's id for its duplicate window, so a rewrite with the crashed put's ids would be
dropped as duplicates and leave the subject empty. A mirror (a rollout site's copy) does not see
the origin's purge: there a reader meets the partial write's chunks before the whole one and
starts over at each chunk numbered 0 (:func:`starts_a_write`).

nats-py's ``ObjectStore.get`` reads ≈50 MiB/s because its iterator subscription answers flow
control on a poll; here each chunk is read by a direct get (``next_by_subj``) into a
preallocated buffer and hashed as it arrives. A reader needs no consumer of its own, which a
worker's credential may not create (a push consumer delivers wherever its creator says).
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import msgspec

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import DataPlaneError, OutgoingMessage
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
from dockyard.broker.weight_blobs.manifest import (
    BlobManifest,
    BlobManifestError,
    decode_manifest,
    encode_manifest,
)
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


def chunk_msg_id(hex_digest: str, write: str, index: int) -> str:
    """One put's chunk id: unique to that put (``write``), so a later put of the same blob is
    never dropped by the duplicate window as the repeat of an interrupted one; the same within
    the put, so its own retries stay harmless."""
    return f"blob:{hex_digest}:{write}:{index}"


def starts_a_write(msg_id: str | None, hex_digest: str) -> bool:
    """Whether a chunk is the first of a put: ``blob:<hex>:<write>:0`` (or, as stores written
    before writes were named hold, ``blob:<hex>:0``)."""
    return (
        msg_id is not None
        and msg_id.startswith(f"blob:{hex_digest}:")
        and msg_id.rsplit(":", 1)[-1] == "0"
    )


class JetStreamBlobStore(WeightBlobStore):
    def __init__(
        self,
        plane: JetStreamPlane,
        *,
        keep_last: int,
        grace_s: float,
        chunk_size: int,
        stall_timeout_s: float,
        leases: BlobLeases | None = None,
    ) -> None:
        super().__init__(keep_last=keep_last, grace_s=grace_s, leases=leases)
        self.plane = plane
        self.names = plane.names
        self.chunk_size = chunk_size
        self.stall_timeout_s = stall_timeout_s

    def uri_for(self, hex_digest: str) -> str:
        return f"nats-blob://{self.names.blobs_stream.name}/{hex_digest}"

    async def _manifest(self, hex_digest: str) -> BlobManifest | None:
        subject = self.names.blob_manifest_subject(hex_digest)
        stored = await self.plane.latest(subject)
        if stored is None:
            return None
        return decode_manifest(stored.data, hex_digest=hex_digest, where=subject)

    async def put(self, version: int, source: BlobSource) -> BlobRef:
        data = await asyncio.to_thread(source_to_bytes, source)
        digest = await asyncio.to_thread(digest_of_bytes, data)
        hex_digest = digest.removeprefix(DIGEST_PREFIX)
        existing = await self._manifest(hex_digest)
        if existing is not None:  # content-addressed: the same bytes are stored once
            return existing.ref(self.uri_for(hex_digest))
        chunk_size = min(self.chunk_size, self.plane.usable_payload)
        view = memoryview(data)
        subject = self.names.blob_data_subject(hex_digest)
        # No manifest: any chunks there are an interrupted put's, which no reader reads. Cleared,
        # so the subject holds exactly the chunks the manifest will name.
        await self.plane.purge(subject)
        write = uuid.uuid4().hex[:12]
        chunks = [
            OutgoingMessage(
                subject,
                bytes(view[offset : offset + chunk_size]),
                chunk_msg_id(hex_digest, write, i),
            )
            for i, offset in enumerate(range(0, len(data), chunk_size))
        ]
        await self.plane.publish_many(chunks)
        ref = new_ref(version, digest, len(data), self.uri_for(hex_digest))
        manifest = BlobManifest(
            version=ref.version,
            digest=ref.digest,
            nbytes=ref.nbytes,
            chunks=len(chunks),
            chunk_size=chunk_size,
            created_at_unix_s=ref.created_at_unix_s,
        )
        await self.plane.publish(
            self.names.blob_manifest_subject(hex_digest),
            encode_manifest(manifest),
            msg_id=f"blob:{hex_digest}:manifest",
        )
        return ref

    async def _manifest_arriving(self, hex_digest: str) -> BlobManifest | None:
        """At a rollout site the blobs are a mirror of the trainer site's, copied alongside the
        weight-event mirror but not in step with it: a worker can see a version's event before
        its blob. Wait for the manifest (the last thing a blob's writer stores, so its chunks
        are here too) as long as a stalled fetch is waited for."""
        if self.plane.config.site.trainer_domain is None:
            return None  # single site: the event is published after the blob, so it is gone
        subject = self.names.blob_manifest_subject(hex_digest)
        try:
            async with asyncio.timeout(self.stall_timeout_s):
                async for stored in self.plane.watch(subject):
                    return decode_manifest(stored.data, hex_digest=hex_digest, where=subject)
        except TimeoutError:
            return None
        return None

    async def _read_bytes(self, ref: BlobRef) -> bytes:
        manifest = await self._manifest(ref.hex) or await self._manifest_arriving(ref.hex)
        if manifest is None:
            raise BlobNotFound(f"no blob {ref.digest} in stream {self.names.blobs_stream.name}")
        if isinstance(manifest.chunks, msgspec.UnsetType):
            raise BlobManifestError(
                f"blob manifest {self.names.blob_manifest_subject(ref.hex)} has no chunk count"
            )
        nbytes, expected_chunks = manifest.nbytes, manifest.chunks
        stream = self.names.blobs_stream.name
        subject = self.names.blob_data_subject(ref.hex)
        buffer = bytearray(nbytes)
        hasher = hashlib.sha256()
        # Read to the subject's end, not just ``chunks`` messages: at a mirror an interrupted
        # write's chunks may come first, and the blob is the write that starts last.
        offset, seq, read, overflow = 0, 1, 0, False
        while True:
            try:
                async with asyncio.timeout(self.stall_timeout_s):
                    chunk = await self.plane.next_stored(stream, subject, seq)
            except TimeoutError:
                raise DataPlaneError(
                    f"blob {ref.digest}: no chunk for {self.stall_timeout_s:g}s after "
                    f"{read}/{expected_chunks} chunks"
                ) from None
            if chunk is None:
                break
            seq = chunk.seq + 1
            if read and starts_a_write(chunk.msg_id, ref.hex):
                log.warning(
                    "weight_blob.interrupted_write_skipped",
                    digest=ref.digest,
                    chunks=read,
                    at_seq=chunk.seq,
                )
                offset, read, overflow, hasher = 0, 0, False, hashlib.sha256()
            read += 1
            end = offset + len(chunk.data)
            if end > nbytes or overflow:
                overflow = True  # refused below, unless a later write starts over
                continue
            buffer[offset:end] = chunk.data
            hasher.update(chunk.data)
            offset = end
        if overflow or read > expected_chunks:
            raise DataPlaneError(
                f"blob {ref.digest} has more bytes than its manifest says "
                f"({read} chunks for a manifest of {expected_chunks})"
            )
        if offset != nbytes:
            raise DataPlaneError(f"blob {ref.digest}: got {offset} of {nbytes} bytes")
        check_digest(ref.digest, DIGEST_PREFIX + hasher.hexdigest(), self.uri_for(ref.hex))
        return bytes(buffer)

    async def refs(self) -> list[BlobRef]:
        out = []
        async for stored in self.plane.replay(self.names.blob_manifests_wildcard):
            hex_digest = stored.subject.split(".")[-2]  # <ns>.blobs.<hex>.meta
            manifest = decode_manifest(stored.data, hex_digest=hex_digest, where=stored.subject)
            out.append(manifest.ref(self.uri_for(hex_digest)))
        return sorted(out, key=lambda r: r.version)

    async def delete(self, ref: BlobRef) -> None:
        # Manifest first: a reader never finds a manifest whose chunks are gone.
        await self.plane.purge(self.names.blob_manifest_subject(ref.hex))
        await self.plane.purge(self.names.blob_data_subject(ref.hex))
