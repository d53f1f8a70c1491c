"""The NATS JetStream plane: the non-colocated data plane for fleets across machines.

Publishing: deterministic ``Nats-Msg-Id`` (dedupe window), acks awaited with a timeout, bounded
retries (transient refusals — 429 when a stream's ingest buffer is full, 503 — back off and
retry), a bounded outbound buffer while the broker is away, ``publish_async`` windows bounded in
messages and bytes, whose refused publishes fail at once (:class:`_JetStream`) and are retried
on the awaited path. Consuming: durable pull
consumers with a byte cap per request (:mod:`jetstream_pull`). Oversized payloads travel by
reference (:mod:`chunking`). Messages that exhaust ``max_deliver`` are turned into dead letters
from the server's advisory by whichever process consumes from that durable.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from dockyard.broker import chunking, exhausted
from dockyard.broker.admin import AdminPlane
from dockyard.broker.connection import (
    ConnectionEvents,
    DockyardClient,
    connect,
    server_urls,
)
from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream_pull import JetStreamDelivery, PullChannel, user_headers
from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import (
    HEADER_MSG_ID,
    ConsumerLag,
    DataPlaneError,
    Delivery,
    OutgoingMessage,
    PayloadError,
    PermissionDenied,
    ProvisionReport,
    PublishAck,
    PublishError,
    StoredMessage,
    StreamState,
)
from dockyard.broker.provisioning import (
    consumer_config,
    ensure_consumer,
    ensure_stream,
    stream_config,
)
from dockyard.broker.sites import (
    PromptRouter,
    backlog_readers,
    check_domain,
    consumers_at_site,
    prompt_source_consumer,
    prompt_source_consumer_config,
)
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.observability.prometheus import PUBLISH_RETRIES
from dockyard.utils.logging import get_logger
from dockyard.utils.tasks import spawn

log = get_logger(__name__)


class _AnswerLost(Exception):
    """The connection a request went out on dropped before its answer came."""


_RETRYABLE = (
    _AnswerLost,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    asyncio.TimeoutError,
)
_MAX_BACKOFF_S = 2.0
#: Refusals that pass: 429 "too many requests" (a stream's ingest buffer is full, server ≥ 2.11)
#: and 503 (JetStream briefly unavailable, e.g. during a leader election).
_TRANSIENT_API_CODES = frozenset({429, 503})
#: nats-py's bound on pipelined publishes awaiting an ack on one connection, all windows
#: together (its default); past it a publish waits for a free slot, at most ``publish.timeout_s``.
PENDING_PUBLISH_SLOTS = 4000


class _JetStream(JetStreamContext):
    """nats-py's context, with a refused pipelined publish failing its future, and one that
    never went out giving its pending slot back.

    nats-py's reply handler raises the server's error instead of setting it on the future
    (``APIError.from_error`` raises; nats.py #985), so a publish refused with 429 would only be
    noticed when the window's timeout ran out. And ``publish_async`` takes a pending slot and
    registers the ack's future before it hands the message to the connection: when that raises
    (the outbound buffer full while reconnecting, a closed connection, a cancellation), the
    future is never returned, nothing completes it, and the slot stays taken for good — after
    enough failures every pipelined publish would stall for a timeout. The context therefore
    listens to its client's unsent publishes (:class:`DockyardClient`) and cancels such a
    future at once (its done-callback gives the slot back).
    """

    def __init__(self, conn: DockyardClient, **kwargs: Any) -> None:
        super().__init__(conn, **kwargs)
        conn.unsent_listeners.append(self.forget_unsent)

    def forget_unsent(self, reply: str) -> None:
        """Cancel the ack future waiting on ``reply`` (a pipelined publish that never went out)."""
        # nats-py internals (2.x), like ``_handle_async_reply`` below: nats-py has no public
        # way to reach the future of a pipelined publish before ``publish_async`` returns it.
        prefix = getattr(self, "_async_reply_prefix", None)
        if not prefix or not reply.startswith(prefix.decode()):
            return
        future = getattr(self, "_publish_async_futures", {}).get(reply[len(prefix) :])
        if future is not None and not future.done():
            future.cancel()

    async def _handle_async_reply(self, msg: Msg) -> None:
        try:
            await super()._handle_async_reply(msg)
        except APIError as error:
            # nats-py internals (2.x), no public equivalent (the handler is nats-py's own
            # callback): without them the window's timeout still catches it.
            prefix = getattr(self, "_async_reply_prefix", None)
            futures = getattr(self, "_publish_async_futures", {})
            future = futures.get(msg.subject[len(prefix) :]) if prefix else None
            if future is not None and not future.done():
                future.set_exception(error)


class JetStreamPlane(AdminPlane):
    def __init__(
        self, config: DataPlaneConfig, *, provision: bool = True, client_name: str = "dockyard"
    ) -> None:
        super().__init__(config)
        self._provision_on_start = provision
        self._client_name = client_name
        self._events = ConnectionEvents()
        self._nc: DockyardClient | None = None
        self._js: JetStreamContext | None = None
        self._embedded: EmbeddedNatsServer | None = None
        self._channels: dict[str, PullChannel] = {}
        self._advisory_subs: list[object] = []
        self._sweepers: list[asyncio.Task[None]] = []
        self._known_consumers: set[str] = set()
        self._prompt_router = PromptRouter(self.names, config.site)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def nc(self) -> DockyardClient:
        if self._nc is None:
            raise DataPlaneError("the JetStream plane is not started (use `async with plane`)")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise DataPlaneError("the JetStream plane is not started (use `async with plane`)")
        return self._js

    @property
    def reconnects(self) -> int:
        """How often the connection came back after a broker outage."""
        return self._events.reconnects

    @property
    def embedded_server(self) -> EmbeddedNatsServer | None:
        return self._embedded

    async def start(self) -> None:
        if self._nc is not None:
            return
        embedded_url = None
        if self.config.is_embedded:
            embedded_url = await asyncio.to_thread(self._start_embedded)
        urls = server_urls(self.config, embedded_url)
        try:
            self._nc = await connect(self.config, urls, self._events, name=self._client_name)
        except (nats.errors.NoServersError, OSError, TimeoutError) as error:
            raise DataPlaneError(
                f"cannot connect to the data plane at {urls}: {error!r}"
            ) from error
        self._js = _JetStream(
            self._nc,
            prefix=self.config.api_prefix,
            timeout=self.config.publish.timeout_s,
            publish_async_max_pending=PENDING_PUBLISH_SLOTS,
        )
        await check_domain(self._js, self.config.site)
        if self._provision_on_start:
            await self.provision()

    def _start_embedded(self) -> str:
        embedded = self.config.embedded
        store = (
            Path(embedded.store_dir)
            if embedded.store_dir
            else Path(tempfile.mkdtemp(prefix="dockyard-nats-"))
        )
        self._embedded = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=store,
                host=embedded.host,
                port=embedded.port,
                max_payload=self.config.max_payload,
                max_pending=self.config.max_pending,
            )
        )
        return self._embedded.start()

    async def close(self) -> None:
        for sweeper in self._sweepers:
            sweeper.cancel()
        await asyncio.gather(*self._sweepers, return_exceptions=True)
        self._sweepers.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._nc is not None:
            self._events.closing = True
            # Closing after the broker died must not fail the caller: nothing is left to flush.
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                async with asyncio.timeout(5):
                    await self._nc.close()
            self._nc = None
            self._js = None
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
            self._embedded = None

    # -- provisioning ------------------------------------------------------------------------
    async def provision(self) -> ProvisionReport:
        outcomes = []
        for spec in self.names.all_streams():
            wanted = stream_config(
                spec, self.config, is_blob_store=spec.name == self.names.blobs_stream.name
            )
            outcomes.append(await ensure_stream(self.js, wanted))
        for consumer in consumers_at_site(self.names, self.config.site):
            outcomes.append(
                await ensure_consumer(self.js, consumer, consumer_config(consumer, self.config))
            )
            self._known_consumers.add(consumer.durable)
        for domain in self.config.site.rollout_domains:
            spec = prompt_source_consumer(self.names, domain)
            wanted = prompt_source_consumer_config(self.names, domain)
            outcomes.append(await ensure_consumer(self.js, spec, wanted))
            self._known_consumers.add(spec.durable)  # never to be made a pull consumer
        return ProvisionReport(
            created=tuple(o.name for o in outcomes if o.action == "created"),
            updated=tuple(o.name for o in outcomes if o.action == "updated"),
            unchanged=tuple(o.name for o in outcomes if o.action == "unchanged"),
        )

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        if spec.durable in self._known_consumers:
            return
        await ensure_consumer(self.js, spec, consumer_config(spec, self.config))
        self._known_consumers.add(spec.durable)

    # -- producing ---------------------------------------------------------------------------
    @property
    def usable_payload(self) -> int:
        """Bytes one message may carry: the smaller of the config's and the server's cap."""
        server_cap = self.nc.max_payload or self.config.max_payload
        return min(self.config.max_payload, server_cap) - chunking.HEADER_ROOM

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishAck:
        subject = await self._prompt_router.routed_subject(self.js, subject, msg_id)
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
        await self._publish_window(list(split.chunks))
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
            except _RETRYABLE as error:
                last_error = error
                log.warning(
                    "publish.retry", subject=subject, attempt=attempt + 1, error=repr(error)
                )
                if not isinstance(error, nats.errors.TimeoutError | asyncio.TimeoutError):
                    # Immediate failures (buffer full, reconnecting) back off; timeouts already
                    # waited a whole timeout.
                    await asyncio.sleep(min(_MAX_BACKOFF_S, 0.05 * 2**attempt))
            except nats.errors.ConnectionClosedError as error:
                # Closed for good (the plane is closing): no retry can succeed. A DataPlaneError,
                # so that roles treat it like any other broker failure.
                raise PublishError(f"publish to {subject}: the connection is closed") from error
            except APIError as error:
                if error.code not in _TRANSIENT_API_CODES:
                    raise PublishError(
                        f"broker refused publish to {subject}: {error.description} "
                        f"(code {error.err_code})"
                    ) from error
                last_error = error
                log.warning("publish.retry", subject=subject, attempt=attempt + 1, error=str(error))
                await asyncio.sleep(min(_MAX_BACKOFF_S, 0.05 * 2**attempt))
        reason = (
            "the outbound buffer is full (broker unreachable)"
            if isinstance(last_error, nats.errors.OutboundBufferLimitError)
            else "no acknowledgement"
        )
        raise PublishError(
            f"publish to {subject} failed after {settings.retries + 1} attempts "
            f"({settings.timeout_s:g}s each): {reason}; last error {last_error!r}"
        ) from last_error

    async def _publish_once(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> PublishAck:
        denied = self._events.permissions.denied(subject)
        dropped = self._events.next_drop()
        publishing = asyncio.ensure_future(
            self.js.publish(
                subject, payload, timeout=self.config.publish.timeout_s, headers=headers
            )
        )
        try:
            done, _ = await asyncio.wait(
                {publishing, denied, dropped}, return_when=asyncio.FIRST_COMPLETED
            )
            if denied in done:
                if not publishing.cancel() and not publishing.cancelled():
                    # It ended at the same moment; its outcome is moot next to the denial, but
                    # retrieved, so that asyncio does not report it as lost.
                    publishing.exception()
                raise PermissionDenied(
                    f"not allowed to publish to {subject} with these credentials: {denied.result()}"
                )
            if publishing not in done:
                raise _AnswerLost(f"the connection dropped before the ack of {subject}")
            ack = publishing.result()
        finally:
            self._events.permissions.forget(subject, denied)
            if not publishing.done():
                publishing.cancel()
        return PublishAck(ack.stream, ack.seq, bool(ack.duplicate))

    async def publish_many(self, messages: Sequence[OutgoingMessage]) -> list[PublishAck]:
        messages = await self._prompt_router.routed(self.js, messages)
        small = [m for m in messages if len(m.payload) <= self.usable_payload]
        if len(small) != len(messages):  # keep order simple: mixed batches go one by one
            return await super().publish_many(messages)
        return await self._publish_window(list(messages))

    async def _publish_window(self, messages: list[OutgoingMessage]) -> list[PublishAck]:
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
            return await self.js.publish_async(
                message.subject,
                message.payload,
                headers=headers,
                wait_stall=self._stall_timeout(timeout),
            )
        except (*_RETRYABLE, nats.js.errors.TooManyStalledMsgsError):
            return None

    def _stall_timeout(self, timeout: float) -> float | None:
        """``wait_stall`` for the next ``publish_async``: None while a slot is free (the wait
        cannot block then, and on Python 3.11 a timeout makes ``asyncio.wait_for`` start a task
        per publish: about a third of a small message's publish cost), else ``timeout``."""
        # nats-py internals (2.x): it exposes no count of free pending slots. Without them
        # every publish pays for the timeout. Not before
        # the reply subscription exists: setting it up yields before the slot is taken.
        semaphore = getattr(self.js, "_publish_async_pending_semaphore", None)
        ready = bool(getattr(self.js, "_async_reply_prefix", None))
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

    # -- consuming ---------------------------------------------------------------------------
    async def _channel(self, spec: ConsumerSpec) -> PullChannel:
        channel = self._channels.get(spec.durable)
        if channel is None:
            await self.ensure_consumer(spec)
            channel = PullChannel(
                self.nc,
                spec,
                api_prefix=self.config.api_prefix,
                max_bytes=max(1, self.config.max_pending // 2),
            )
            await channel.open()
            self._advisory_subs.append(await exhausted.watch(self, spec))
            if exhausted.is_work_queue(self, spec):
                # Exhausted messages an outage left behind (advisories nobody heard).
                await exhausted.sweep_now(self, spec)
                self._sweepers.append(
                    spawn(exhausted.sweep_periodically(self, spec), name=f"sweep-{spec.durable}")
                )
            self._channels[spec.durable] = channel
        return channel

    async def fetch(
        self, consumer: ConsumerSpec, batch: int | None = None, timeout_s: float = 1.0
    ) -> list[Delivery]:
        channel = await self._channel(consumer)
        want = batch or self.config.consumer.fetch_batch
        try:
            msgs = await channel.fetch(want, timeout_s)
        except (nats.errors.ConnectionReconnectingError, nats.errors.ConnectionClosedError) as e:
            log.warning("fetch.disconnected", consumer=consumer.durable, error=repr(e))
            with contextlib.suppress(TimeoutError):  # wait for the reconnect, do not spin
                async with asyncio.timeout(timeout_s):
                    await self._events.connected.wait()
            return []
        deliveries: list[Delivery] = []
        for msg in msgs:
            delivery = await self._to_delivery(msg)
            if delivery is not None:
                deliveries.append(delivery)
        return deliveries

    async def _to_delivery(self, msg: Msg) -> Delivery | None:
        """The delivery as published, or None when it was refused: its headers are input like
        its payload, and one the plane cannot read (malformed, or chunks gone) is dead-lettered
        with its reason here (``chunking.read``), so no consumer ever fails on it."""
        headers = user_headers(msg.headers)
        try:
            headers, data = await chunking.read(headers, msg.data, self._chunk)
        except PayloadError as error:
            raw = JetStreamDelivery(msg, data=msg.data, headers=headers)
            await self.refuse(raw, error.reason, str(error))
            return None
        return JetStreamDelivery(msg, data=data, headers=headers)

    async def _chunk(self, ref: str, index: int) -> bytes | None:
        """Chunk ``index`` of ``ref`` (a ``chunking.ChunkReader``), None when it is gone."""
        subject = self.names.chunk_subject(ref, index)
        try:
            raw = await self._direct_get(self.names.chunks_stream.name, subject=subject)
        except NotFoundError:
            return None
        return raw.data or b""

    async def consumer_lag(self, consumer: ConsumerSpec) -> ConsumerLag:
        readers = backlog_readers(self.names, self.config.site, consumer)
        for reader in readers:
            await self.ensure_consumer(reader)
        infos = [await self.js.consumer_info(r.stream, r.durable) for r in readers]
        return ConsumerLag(
            readers[0].durable if len(readers) == 1 else consumer.durable,
            consumer.stream,
            pending=sum(int(i.num_pending or 0) for i in infos),
            ack_pending=sum(int(i.num_ack_pending or 0) for i in infos),
            redelivered=sum(int(i.num_redelivered or 0) for i in infos),
        )

    # -- reading history ---------------------------------------------------------------------
    async def _direct_get(
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
                    on_drop = functools.partial(_expire_now, deadline)
                    dropped.add_done_callback(on_drop)
                    try:
                        return await self.js.get_msg(
                            stream, seq, subject=subject, direct=True, next=at_or_after
                        )
                    finally:
                        dropped.remove_done_callback(on_drop)
            except _RETRYABLE as error:
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
            user_headers(raw.headers), raw.data or b"", self._chunk, seq=seq
        )
        timestamp = raw.time if isinstance(raw.time, datetime) else datetime.now(UTC)
        return StoredMessage(stream, raw.subject or "", seq, timestamp, headers, data)

    async def get(self, stream: str, seq: int) -> StoredMessage:
        try:
            raw = await self._direct_get(stream, seq)
        except NotFoundError:
            raise KeyError(f"stream {stream} has no message {seq}") from None
        return await self._stored(stream, raw)

    async def next_stored(self, stream: str, subject: str, from_seq: int) -> StoredMessage | None:
        """The first message on ``subject`` at or after ``from_seq``, or None."""
        try:
            raw = await self._direct_get(stream, from_seq, subject=subject, at_or_after=True)
        except NotFoundError:
            return None
        return await self._stored(stream, raw)

    async def latest(self, subject: str) -> StoredMessage | None:
        stream = self.names.stream_for_subject(subject).name
        try:
            raw = await self._direct_get(stream, subject=subject)
        except NotFoundError:
            return None
        return await self._stored(stream, raw)

    async def purge(self, subject: str) -> None:
        stream = self.names.stream_for_subject(subject).name
        with contextlib.suppress(NotFoundError):
            await self.js.purge_stream(stream, subject=subject)

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
                raw = await self._direct_get(stream, seq, subject=subject, at_or_after=True)
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
            response = await self.nc.request(
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
        stream = self.followed_stream(subject)
        wake = asyncio.Event()

        async def on_notice(_: Msg) -> None:
            wake.set()

        async def on_reconnect() -> None:
            wake.set()

        subscription = await self.nc.subscribe(self.names.stored_notice(subject), cb=on_notice)
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
                except (*_RETRYABLE, APIError) as error:
                    # The broker away, or just back with JetStream not ready yet: read on (from
                    # the cursor, so nothing is skipped) once it answers, not at the next notice.
                    if isinstance(error, APIError) and error.code not in _TRANSIENT_API_CODES:
                        raise
                    log.warning("watch.read_retry", subject=subject, error=repr(error))
                    await asyncio.sleep(min(_MAX_BACKOFF_S, 0.05 * 2**failures))
                    failures += 1
                    wake.set()
        finally:
            self._events.on_reconnect.remove(on_reconnect)
            with contextlib.suppress(Exception):  # the connection may already be gone
                await subscription.unsubscribe()

    async def streams(self) -> list[StreamState]:
        states: list[StreamState] = []
        for spec in self.names.all_streams():
            try:
                info = await self.js.stream_info(spec.name)
            except NotFoundError:
                continue
            lags = []
            for consumer in await self.js.consumers_info(spec.name):
                lags.append(
                    ConsumerLag(
                        consumer.name,
                        spec.name,
                        pending=int(consumer.num_pending or 0),
                        ack_pending=int(consumer.num_ack_pending or 0),
                        redelivered=int(consumer.num_redelivered or 0),
                    )
                )
            state = info.state
            states.append(
                StreamState(
                    name=spec.name,
                    subjects=tuple(info.config.subjects or ()),
                    retention=str(getattr(info.config.retention, "value", info.config.retention)),
                    messages=state.messages,
                    bytes=state.bytes,
                    first_seq=state.first_seq,
                    last_seq=state.last_seq,
                    first_time=_parse_time(getattr(state, "first_ts", None)),
                    last_time=_parse_time(getattr(state, "last_ts", None)),
                    consumers=tuple(lags),
                )
            )
        return states


def _parse_time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value and not value.startswith("0001"):
        # The server writes RFC 3339 with nanoseconds; Python 3.11 reads it (truncated to µs),
        # so nats-py's private parser is not needed.
        return datetime.fromisoformat(value)
    return None


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds


def _expire_now(deadline: asyncio.Timeout, _: object) -> None:
    """Done-callback of a connection drop: the read under ``deadline`` times out now."""
    with contextlib.suppress(RuntimeError):  # the read ended before this callback ran
        deadline.reschedule(asyncio.get_running_loop().time())


def _why_not_acked(future: asyncio.Future[api.PubAck], timeout_s: float) -> str:
    """Why a pipelined publish gets no ack (and stops being waited for)."""
    if not future.done():
        future.cancel()
        return f"no ack within {timeout_s:g}s"
    if future.cancelled():
        return "cancelled (not sent, or the connection dropped before its ack)"
    error = future.exception()
    return str(error) or repr(error)
