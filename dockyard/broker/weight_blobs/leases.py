"""Reader leases on weight blobs: retention never deletes a version a worker is fetching.

A reader announces, before it starts reading a blob, that it holds a lease on it until a time a
little in the future (``ttl_s``), renews the lease while the fetch runs, and releases it when
done. The pruner keeps every version with a live lease, whatever its age. A reader that dies
mid-fetch stops renewing, so its lease lapses after at most ``ttl_s`` and nothing stays pinned.

Leases travel over the data plane, not the blob transport, so they work the same whether the
bytes come from JetStream chunks, a shared directory or an HTTP server: one record per
(blob, reader) on ``<ns>.leases.<hex>.<reader>`` in a stream that keeps only the newest record
of each subject (a release overwrites the lease, so the stream never grows with time).

Clocks: a lease's expiry is the reader's wall clock; the pruner compares it with its own. The
time-based grace (``retention_grace_s``) still applies on top of leases, so a clock skew smaller
than the grace cannot lose a blob; keep fleet clocks NTP-synchronised all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Iterable

from pydantic import BaseModel, ValidationError

from dockyard.broker.admin import AdminPlane
from dockyard.broker.plane import DataPlaneError
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_NOT_A_SUBJECT_TOKEN = re.compile(r"[^A-Za-z0-9_-]+")


class LeaseRecord(BaseModel):
    """The JSON body of a lease subject's newest message."""

    reader: str
    version: int
    #: Unix time after which the lease no longer protects the blob; 0 = released.
    expires_at_unix_s: float


def default_reader_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def subject_token(text: str) -> str:
    """``text`` as one NATS subject token (no dots, wildcards or spaces)."""
    return _NOT_A_SUBJECT_TOKEN.sub("_", text)[:128] or "_"


class BlobLeases:
    def __init__(self, plane: AdminPlane, *, ttl_s: float, reader_id: str | None = None) -> None:
        if ttl_s <= 0:
            raise ValueError(f"a lease ttl must be positive, got {ttl_s}")
        self.plane = plane
        self.ttl_s = ttl_s
        self.reader = subject_token(reader_id or default_reader_id())
        self._counter = 0

    @contextlib.asynccontextmanager
    async def hold(self, hex_digest: str, version: int) -> AsyncIterator[None]:
        """A live lease on the blob for as long as the block runs.

        A lease that cannot be written (no permission for ``NS.leases.>``, broker trouble) does
        not stop the read: it goes ahead protected by the retention grace period alone.
        """
        try:
            await self._write(hex_digest, version, time.time() + self.ttl_s)
        except DataPlaneError as error:
            log.warning(
                "weight_blob.lease_unavailable",
                version=version,
                error=str(error),
                hint="reading under the retention grace period only",
            )
            yield
            return
        renewer = asyncio.create_task(self._renew(hex_digest, version))
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            try:
                await self._write(hex_digest, version, 0.0)
            except DataPlaneError as error:  # the lease lapses by itself after ttl_s
                log.warning("weight_blob.lease_release_failed", error=repr(error))

    async def _renew(self, hex_digest: str, version: int) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self._write(hex_digest, version, time.time() + self.ttl_s)
            except DataPlaneError as error:  # keep trying: the fetch itself may still finish
                log.warning("weight_blob.lease_renew_failed", error=repr(error))

    async def _write(self, hex_digest: str, version: int, expires_at: float) -> None:
        self._counter += 1
        record = LeaseRecord(reader=self.reader, version=version, expires_at_unix_s=expires_at)
        await self.plane.publish(
            self.plane.names.lease_subject(hex_digest, self.reader),
            record.model_dump_json().encode(),
            # Unique per write: a renewal must never be dropped as a duplicate of the lease.
            msg_id=f"lease:{hex_digest}:{self.reader}:{os.getpid()}:{self._counter}:{expires_at}",
        )

    async def live(
        self, hex_digests: Iterable[str], now: float | None = None
    ) -> dict[str, list[str]]:
        """Of the given blobs (hex digests), those with a live lease → the readers holding it."""
        now = time.time() if now is None else now
        out: dict[str, list[str]] = {}
        for hex_digest in hex_digests:
            async for stored in self.plane.replay(self.plane.names.leases_of(hex_digest)):
                try:
                    record = LeaseRecord.model_validate_json(stored.data)
                except ValidationError:
                    log.warning("weight_blob.bad_lease_record", subject=stored.subject)
                    continue
                if record.expires_at_unix_s > now:
                    out.setdefault(hex_digest, []).append(record.reader)
        return out

    async def forget(self, hex_digest: str) -> None:
        """Drop every lease record of a deleted blob, so the stream holds only current ones."""
        await self.plane.purge(self.plane.names.leases_of(hex_digest))
