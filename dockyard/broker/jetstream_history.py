"""Reading JetStream history without a consumer: direct gets that ride out an outage, stored
messages with their chunks reassembled, replay, and following an announcing subject.

A role's credential may not create consumers, so every read here is a direct get (``$JS.API.
DIRECT.GET``); followers wake on the stream's stored-message notices (:meth:`watch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import nats.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NotFoundError

from dockyard.broker import chunking
from dockyard.broker.connection import ConnectionEvents
from dockyard.broker.jetstream_context import (
    MAX_BACKOFF_S,
    RETRYABLE,
    TRANSIENT_API_CODES,
    Connected,
    expire_now,
)
from dockyard.broker.jetstream_pull import user_headers
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import DataPlaneError, StoredMessage
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class JetStreamHistory:
    """The plane's reading half; ``followed_stream`` refuses a subject that cannot be followed
    (:meth:`~dockyard.broker.plane.DataPlane.followed_stream`)."""

    def __init__(
        self,
        config: DataPlaneConfig,
        names: PlaneNames,
        events: ConnectionEvents,
        link: Connected,
        followed_stream: Callable[[str], str],
    ) -> None:
        self.config = config
        self.names = names
        self._events = events
        self._link = link
        self._followed_stream = followed_stream

    async def chunk(self, ref: str, index: int) -> bytes | None:
        """Chunk ``index`` of ``ref`` (a ``chunking.ChunkReader``), None when it is gone."""
        subject = self.names.chunk_subject(ref, index)
        try:
            raw = await self.direct_get(self.names.chunks_stream.name, subject=subject)
        except NotFoundError:
            return None
        return raw.data or b""

    async def direct_get(
        self,
        stream: str,
        seq: int | None = None,
        *,
        subject: str | None = None,
        at_or_after: bool = False,
    ) -> api.RawStreamMsg:
        """A direct get (with ``at_or_after``: the first message on ``subject`` at or after
        ``seq``) that rides out a broker outage as a publish does: an attempt whose connection
        drops (its answer cannot come) or that times out (the broker away longer than the
        timeout) is tried again once the connection is back, ``publish.retries`` times. A read
        that gave up at its first timeout killed the trainer when a broker restart met its
        weight publish."""
        settings = self.config.publish
        last_error: BaseException | None = None
        for attempt in range(settings.retries + 1):
            dropped = self._events.next_drop()
            try:
                # Cut short when the connection drops (its answer cannot come): a timeout, then
                # the retry. Cheaper than racing a task per read against the drop.
                async with asyncio.timeout(None) as deadline:
                    on_drop = functools.partial(expire_now, deadline)
                    dropped.add_done_callback(on_drop)
                    try:
                        return await self._link.js.get_msg(
                            stream, seq, subject=subject, direct=True, next=at_or_after
                        )
                    finally:
                        dropped.remove_done_callback(on_drop)
            except RETRYABLE as error:
                last_error = error
                log.warning("read.retry", stream=stream, attempt=attempt + 1, error=repr(error))
                with contextlib.suppress(TimeoutError):  # wait for the reconnect, do not spin
                    async with asyncio.timeout(settings.timeout_s):
                        await self._events.connected.wait()
        raise DataPlaneError(
            f"reading stream {stream} failed after {settings.retries + 1} attempts "
            f"({settings.timeout_s:g}s each); last error {last_error!r}"
        ) from last_error

    async def _stored(self, stream: str, raw: api.RawStreamMsg) -> StoredMessage:
        seq = int(raw.seq or 0)
        # History outlives chunks (they age out of their own stream) and keeps what consumers
        # refused: such a message is read empty, saying why (``chunking.read_stored``).
        headers, data = await chunking.read_stored(
            user_headers(raw.headers), raw.data or b"", self.chunk, seq=seq
        )
        timestamp = raw.time if isinstance(raw.time, datetime) else datetime.now(UTC)
        return StoredMessage(stream, raw.subject or "", seq, timestamp, headers, data)

    async def get(self, stream: str, seq: int) -> StoredMessage:
        try:
            raw = await self.direct_get(stream, seq)
        except NotFoundError:
            raise KeyError(f"stream {stream} has no message {seq}") from None
        return await self._stored(stream, raw)

    async def next_stored(self, stream: str, subject: str, from_seq: int) -> StoredMessage | None:
        """The first message on ``subject`` at or after ``from_seq``, or None."""
        try:
            raw = await self.direct_get(stream, from_seq, subject=subject, at_or_after=True)
        except NotFoundError:
            return None
        return await self._stored(stream, raw)

    async def latest(self, subject: str) -> StoredMessage | None:
        stream = self.names.stream_for_subject(subject).name
        try:
            raw = await self.direct_get(stream, subject=subject)
        except NotFoundError:
            return None
        return await self._stored(stream, raw)

    async def replay(
        self,
        subject: str,
        *,
        from_seq: int | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[StoredMessage]:
        """Direct gets with ``next_by_subj`` walk the stream without creating a consumer."""
        stream = self.names.stream_for_subject(subject).name
        seq = from_seq or 1
        if since is not None and from_seq is None:
            seq = await self._first_seq_since(stream, since)
        count = 0
        while limit is None or count < limit:
            try:
                raw = await self.direct_get(stream, seq, subject=subject, at_or_after=True)
            except NotFoundError:
                return
            message = await self._stored(stream, raw)
            seq = message.seq + 1
            if since is not None and message.timestamp < since:
                continue
            count += 1
            yield message

    async def _first_seq_since(self, stream: str, since: datetime) -> int:
        request = json.dumps({"start_time": since.astimezone(UTC).isoformat()}).encode()
        try:
            response = await self._link.nc.request(
                f"{self.config.api_prefix}.DIRECT.GET.{stream}",
                request,
                timeout=self.config.publish.timeout_s,
            )
        except nats.errors.TimeoutError:
            return 1
        sequence = (response.headers or {}).get("Nats-Sequence")
        return int(sequence) if sequence else 1

    async def watch(
        self, subject: str, *, include_latest: bool = True
    ) -> AsyncIterator[StoredMessage]:
        """Follow ``subject`` without a consumer of our own (a role may not create one: a push
        consumer delivers wherever its creator says, into any stream's subjects too).

        Streams announce each stored message on its ``stored_notice`` (headers only); a notice
        only wakes the reader, which reads on from the last message it read by direct get, in
        stream order. The notices are subscribed before the stream is first read, so nothing
        stored in between is missed, and a reconnect wakes the reader too, for the notices
        lost while disconnected.
        """
        stream = self._followed_stream(subject)
        wake = asyncio.Event()

        async def on_notice(_: Msg) -> None:
            wake.set()

        async def on_reconnect() -> None:
            wake.set()

        subscription = await self._link.nc.subscribe(
            self.names.stored_notice(subject), cb=on_notice
        )
        self._events.on_reconnect.append(on_reconnect)
        try:
            latest = await self.latest(subject)
            cursor = 0 if latest is None else latest.seq
            if latest is not None and include_latest:
                yield latest
            failures = 0
            while True:
                await wake.wait()
                wake.clear()
                try:
                    while stored := await self.next_stored(stream, subject, cursor + 1):
                        cursor = stored.seq
                        yield stored
                    failures = 0
                except (*RETRYABLE, APIError) as error:
                    # The broker away, or just back with JetStream not ready yet: read on (from
                    # the cursor, so nothing is skipped) once it answers, not at the next notice.
                    if isinstance(error, APIError) and error.code not in TRANSIENT_API_CODES:
                        raise
                    log.warning("watch.read_retry", subject=subject, error=repr(error))
                    await asyncio.sleep(min(MAX_BACKOFF_S, 0.05 * 2**failures))
                    failures += 1
                    wake.set()
        finally:
            self._events.on_reconnect.remove(on_reconnect)
            with contextlib.suppress(Exception):  # the connection may already be gone
                await subscription.unsubscribe()
