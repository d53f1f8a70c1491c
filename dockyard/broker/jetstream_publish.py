"""Publishing to JetStream: awaited publishes with bounded retries, pipelined windows, chunks.

Deterministic ``Nats-Msg-Id`` (the dedupe window makes a retry harmless), acks awaited with a
timeout, bounded retries (transient refusals — 429 when a stream's ingest buffer is full, 503 —
back off and retry), ``publish_async`` windows bounded in messages and bytes whose refused
publishes fail at once (:class:`~dockyard.broker.jetstream_context.PipelinedJetStream`) and are
retried on the awaited path. Oversized payloads travel by reference (:mod:`chunking`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

import nats.errors
from nats.js import api
from nats.js.errors import APIError, TooManyStalledMsgsError

from dockyard.broker import chunking
from dockyard.broker.connection import ConnectionEvents
from dockyard.broker.jetstream_context import (
    MAX_BACKOFF_S,
    RETRYABLE,
    TRANSIENT_API_CODES,
    AnswerLost,
    Connected,
)
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import (
    HEADER_MSG_ID,
    OutgoingMessage,
    PermissionDenied,
    PublishAck,
    PublishError,
    StreamFull,
)
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.observability.prometheus import PUBLISH_RETRIES
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: JetStream's error code for a publish a ``discard: new`` stream refused at its limits
#: ("maximum bytes exceeded", "maximum messages exceeded"; HTTP-like code 503).
STREAM_FULL_CODE = 10077
#: The longest pause between retries into a full stream: room comes back when a reader acks or
#: the history is trimmed, so a few seconds' delay is nothing next to the wait itself.
MAX_FULL_STREAM_BACKOFF_S = 2.0


class JetStreamPublisher:
    """The plane's publishing half; it reaches the connection through ``link`` (the plane)."""

    def __init__(
        self,
        config: DataPlaneConfig,
        names: PlaneNames,
        events: ConnectionEvents,
        link: Connected,
    ) -> None:
        self.config = config
        self.names = names
        self._events = events
        self._link = link

    @property
    def usable_payload(self) -> int:
        """Bytes one message may carry: the smaller of the config's and the server's cap."""
        server_cap = self._link.nc.max_payload or self.config.max_payload
        return min(self.config.max_payload, server_cap) - chunking.HEADER_ROOM

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishAck:
        if len(payload) > self.usable_payload:
            return await self._publish_chunked(subject, payload, msg_id, headers or {})
        all_headers = dict(headers or {})
        all_headers[HEADER_MSG_ID] = msg_id
        return await self._publish_with_retries(subject, payload, all_headers)

    async def _publish_chunked(
        self, subject: str, payload: bytes, msg_id: str, headers: Mapping[str, str]
    ) -> PublishAck:
        split = chunking.split(
            self.names,
            subject,
            payload,
            msg_id=msg_id,
            headers=headers,
            chunk_size=self.usable_payload,
        )
        await self.publish_window(list(split.chunks))
        reference = split.reference
        all_headers = dict(reference.headers)
        all_headers[HEADER_MSG_ID] = reference.msg_id
        return await self._publish_with_retries(subject, b"", all_headers)

    async def _publish_with_retries(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> PublishAck:
        settings = self.config.publish
        last_error: BaseException | None = None
        for attempt in range(settings.retries + 1):
            if attempt:
                PUBLISH_RETRIES.inc()
            try:
                return await self._publish_once(subject, payload, headers)
            except RETRYABLE as error:
                last_error = error
                log.warning(
                    "publish.retry", subject=subject, attempt=attempt + 1, error=repr(error)
                )
                if not isinstance(error, nats.errors.TimeoutError | asyncio.TimeoutError):
                    # Immediate failures (buffer full, reconnecting) back off; timeouts already
                    # waited a whole timeout.
                    await asyncio.sleep(min(MAX_BACKOFF_S, 0.05 * 2**attempt))
            except nats.errors.ConnectionClosedError as error:
                # Closed for good (the plane is closing): no retry can succeed. A DataPlaneError,
                # so that roles treat it like any other broker failure.
                raise PublishError(f"publish to {subject}: the connection is closed") from error
            except APIError as error:
                if error.err_code == STREAM_FULL_CODE:
                    # Not a blip: room comes only when readers catch up (or history is
                    # trimmed), so this waits on its own, longer bound.
                    return await self._publish_when_room(subject, payload, headers, error)
                if error.code not in TRANSIENT_API_CODES:
                    raise PublishError(
                        f"broker refused publish to {subject}: {error.description} "
                        f"(code {error.err_code})"
                    ) from error
                last_error = error
                log.warning("publish.retry", subject=subject, attempt=attempt + 1, error=str(error))
                await asyncio.sleep(min(MAX_BACKOFF_S, 0.05 * 2**attempt))
        reason = (
            "the outbound buffer is full (broker unreachable)"
            if isinstance(last_error, nats.errors.OutboundBufferLimitError)
            else "no acknowledgement"
        )
        raise PublishError(
            f"publish to {subject} failed after {settings.retries + 1} attempts "
            f"({settings.timeout_s:g}s each): {reason}; last error {last_error!r}"
        ) from last_error

    async def _publish_when_room(
        self, subject: str, payload: bytes, headers: dict[str, str], refusal: APIError
    ) -> PublishAck:
        """Retry a publish a full stream refused (``discard: new``) until it has room, backing
        off, at most ``publish.full_stream_wait_s``; then :class:`StreamFull`. The stream
        announces no room (no event to wait on), so this polls, bounded by the deadline."""
        settings = self.config.publish
        stream = self.names.stream_for_subject(subject).name
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + settings.full_stream_wait_s
        log.warning(
            "publish.stream_full",
            subject=subject,
            stream=stream,
            error=refusal.description,
            waiting_up_to_s=settings.full_stream_wait_s,
        )
        backoff = 0.05
        while True:
            PUBLISH_RETRIES.inc()
            await asyncio.sleep(min(backoff, max(0.0, deadline - loop.time())))
            backoff = min(MAX_FULL_STREAM_BACKOFF_S, backoff * 2)
            try:
                ack = await self._publish_once(subject, payload, headers)
            except APIError as error:
                if error.err_code != STREAM_FULL_CODE and error.code not in TRANSIENT_API_CODES:
                    raise PublishError(
                        f"broker refused publish to {subject}: {error.description} "
                        f"(code {error.err_code})"
                    ) from error
                refusal = error
            except RETRYABLE as error:
                log.warning("publish.retry", subject=subject, error=repr(error))
            except nats.errors.ConnectionClosedError as error:
                raise PublishError(f"publish to {subject}: the connection is closed") from error
            else:
                log.info(
                    "publish.stream_had_room",
                    subject=subject,
                    stream=stream,
                    waited_s=round(loop.time() - started, 1),
                )
                return ack
            if loop.time() >= deadline:
                raise StreamFull(
                    f"publish to {subject}: stream {stream} is full and stayed full for "
                    f"data_plane.publish.full_stream_wait_s={settings.full_stream_wait_s:g}s "
                    f"({refusal.description}); its readers have not caught up (is the trainer, "
                    f"or are the scorers, running?), or its data_plane.streams limits "
                    f"(max_bytes, max_msgs) are too small for the work in flight",
                    stream=stream,
                )

    async def _publish_once(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> PublishAck:
        denied = self._events.permissions.denied(subject)
        dropped = self._events.next_drop()
        publishing = asyncio.ensure_future(
            self._link.js.publish(
                subject, payload, timeout=self.config.publish.timeout_s, headers=headers
            )
        )
        try:
            racing: set[asyncio.Future[object]] = {publishing, denied, dropped}  # type: ignore[arg-type]  # Futures of different results race; only which is done matters
            done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if denied in done:
                if not publishing.cancel() and not publishing.cancelled():
                    # It ended at the same moment; its outcome is moot next to the denial, but
                    # retrieved, so that asyncio does not report it as lost.
                    publishing.exception()
                raise PermissionDenied(
                    f"not allowed to publish to {subject} with these credentials: {denied.result()}"
                )
            if publishing not in done:
                raise AnswerLost(f"the connection dropped before the ack of {subject}")
            ack = publishing.result()
        finally:
            self._events.permissions.forget(subject, denied)
            if not publishing.done():
                publishing.cancel()
        return PublishAck(ack.stream, ack.seq, bool(ack.duplicate))

    async def publish_window(self, messages: list[OutgoingMessage]) -> list[PublishAck]:
        """Pipelined publishes, at most ``publish.window`` messages and ``publish.window_bytes``
        awaiting an ack at once.

        A message whose pipelined ack does not come back in time, or that the server refused
        (429 when the stream's ingest buffer is full), is republished on the retrying path with
        the same ``Nats-Msg-Id``, so the retry cannot create a duplicate.
        """
        timeout = self.config.publish.timeout_s
        results: list[PublishAck | None] = [None] * len(messages)
        for start, part in self._windows(messages):
            futures: list[asyncio.Future[api.PubAck] | None] = []
            try:
                for message in part:
                    futures.append(await self._publish_pipelined(message, timeout))
                # One wait for the whole window (a wait_for per future costs a task each).
                waiting = [future for future in futures if future is not None]
                if waiting:
                    await self._acks_or_drop(waiting, timeout)
            except BaseException:
                # Cancelled mid-window: a future left waiting would hold one of nats-py's
                # pending slots until an ack that may never come (one lost in a reconnect).
                for future in futures:
                    if future is not None and not future.done():
                        future.cancel()
                raise
            fallbacks: list[int] = []
            first_reason = ""
            for offset, future in enumerate(futures):
                if future is not None:
                    if future.done() and not future.cancelled() and future.exception() is None:
                        ack = future.result()
                        results[start + offset] = PublishAck(
                            ack.stream, ack.seq, bool(ack.duplicate)
                        )
                        continue
                    why = _why_not_acked(future, timeout)  # cancels a future still waiting
                else:
                    why = "not sent (outbound buffer full or reconnecting)"
                first_reason = first_reason or why
                fallbacks.append(start + offset)
            # Each one is sent again on the retrying path: a retry like that path's own.
            PUBLISH_RETRIES.inc(len(fallbacks))
            if fallbacks:  # one line per window, not one per message
                log.warning(
                    "publish_async.fallback",
                    error=first_reason,
                    messages=len(fallbacks),
                    window=len(part),
                )
            for index in fallbacks:
                message = messages[index]
                results[index] = await self.publish(
                    message.subject, message.payload, msg_id=message.msg_id, headers=message.headers
                )
        return [r for r in results if r is not None]

    async def _acks_or_drop(self, acks: list[asyncio.Future[api.PubAck]], timeout: float) -> None:
        """Wait for a window's acks, at most ``timeout``; when the connection drops first, the
        acks still missing are cancelled at once (they cannot come) and so fall back to the
        retrying path after the reconnect, not after the timeout."""
        dropped = self._events.next_drop()

        def cancel_missing(_: asyncio.Future[None]) -> None:
            for ack in acks:
                if not ack.done():
                    ack.cancel()

        dropped.add_done_callback(cancel_missing)
        try:
            await asyncio.wait(acks, timeout=timeout)
        finally:
            dropped.remove_done_callback(cancel_missing)

    async def _publish_pipelined(
        self, message: OutgoingMessage, timeout: float
    ) -> asyncio.Future[api.PubAck] | None:
        """The future of the message's ack, or None when it could not be sent now."""
        headers = dict(message.headers)
        headers[HEADER_MSG_ID] = message.msg_id
        try:
            return await self._link.js.publish_async(
                message.subject,
                message.payload,
                headers=headers,
                wait_stall=self.stall_timeout(timeout),
            )
        except (*RETRYABLE, TooManyStalledMsgsError):
            return None

    def stall_timeout(self, timeout: float) -> float | None:
        """``wait_stall`` for the next ``publish_async``: None while a slot is free (the wait
        cannot block then, and on Python 3.11 a timeout makes ``asyncio.wait_for`` start a task
        per publish: about a third of a small message's publish cost), else ``timeout``."""
        # nats-py internals (2.x): it exposes no count of free pending slots. Without them
        # every publish pays for the timeout. Not before
        # the reply subscription exists: setting it up yields before the slot is taken.
        semaphore = getattr(self._link.js, "_publish_async_pending_semaphore", None)
        ready = bool(getattr(self._link.js, "_async_reply_prefix", None))
        if ready and isinstance(semaphore, asyncio.Semaphore) and not semaphore.locked():
            return None
        return timeout

    def _windows(
        self, messages: list[OutgoingMessage]
    ) -> Iterator[tuple[int, list[OutgoingMessage]]]:
        """Consecutive runs of ``messages`` (and where each starts) within ``publish.window``
        messages and ``publish.window_bytes`` of payload (a larger message goes alone)."""
        settings = self.config.publish
        start = 0
        while start < len(messages):
            end, size = start, 0
            while end < len(messages) and end - start < settings.window:
                size += len(messages[end].payload)
                if size > settings.window_bytes and end > start:
                    break
                end += 1
            yield start, messages[start:end]
            start = end


def _why_not_acked(future: asyncio.Future[api.PubAck], timeout_s: float) -> str:
    """Why a pipelined publish gets no ack (and stops being waited for)."""
    if not future.done():
        future.cancel()
        return f"no ack within {timeout_s:g}s"
    if future.cancelled():
        return "cancelled (not sent, or the connection dropped before its ack)"
    error = future.exception()
    return str(error) or repr(error)
