"""The in-memory plane: JetStream's semantics inside one process (``data_plane: null``).

Acks, redelivery after ``ack_wait``, ``nak`` with delay, ``term``, ``max_deliver`` followed by a
dead letter, dedupe by ``Nats-Msg-Id`` inside the window, work-queue deletion on ack, stream
limits, replay by sequence and time. One ``asyncio.Condition`` wakes fetchers and watchers; all
state is touched from the event loop only, so there are no locks beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.broker import chunking
from dockyard.broker.admin import AdminPlane
from dockyard.broker.names import ConsumerSpec, Retention, StreamSpec, subject_matches
from dockyard.broker.plane import (
    REASON_MAX_DELIVERIES,
    ConsumerLag,
    Delivery,
    PayloadError,
    ProvisionReport,
    PublishAck,
    PublishError,
    StoredMessage,
    StreamState,
)
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    from dockyard.broker.weight_blobs.base import BlobRef

log = get_logger(__name__)


def _now() -> datetime:
    """Message timestamps (a function, so tests can move the clock)."""
    return datetime.now(UTC)


@dataclass
class _Stream:
    spec: StreamSpec
    messages: OrderedDict[int, StoredMessage] = field(default_factory=OrderedDict)
    last_seq: int = 0
    bytes: int = 0
    dedupe: dict[str, tuple[int, float]] = field(default_factory=dict)


@dataclass
class _InFlight:
    deadline: float
    delivery_token: int


@dataclass
class _Consumer:
    spec: ConsumerSpec
    cursor: int = 0  # highest stream seq handed out for the first time
    in_flight: dict[int, _InFlight] = field(default_factory=dict)
    ready_at: dict[int, float] = field(default_factory=dict)  # seq -> when to redeliver
    num_delivered: dict[int, int] = field(default_factory=dict)
    next_token: int = 0


class _MemoryDelivery(Delivery):
    def __init__(
        self, plane: MemoryPlane, consumer: _Consumer, message: StoredMessage, token: int
    ) -> None:
        self._plane = plane
        self._consumer = consumer
        self._token = token
        self.stream = message.stream
        self.subject = message.subject
        self.seq = message.seq
        self.timestamp = message.timestamp
        self.headers = dict(message.headers)
        self.data = message.data
        self.num_delivered = consumer.num_delivered[message.seq]

    def _current(self) -> bool:
        flight = self._consumer.in_flight.get(self.seq)
        return flight is not None and flight.delivery_token == self._token

    async def _ack(self) -> None:
        # Like JetStream, a late ack of an earlier delivery still settles the message.
        self._plane._settle(self._consumer, self.seq, delete_from_work_queue=True)

    async def _nak(self, delay_s: float | None) -> None:
        if not self._current():
            return
        del self._consumer.in_flight[self.seq]
        self._consumer.ready_at[self.seq] = time.monotonic() + (delay_s or 0.0)
        await self._plane._notify()

    async def _term(self, reason: str) -> None:
        self._plane._settle(self._consumer, self.seq, delete_from_work_queue=True)

    async def _in_progress(self) -> None:
        flight = self._consumer.in_flight.get(self.seq)
        if flight is not None and flight.delivery_token == self._token:
            flight.deadline = time.monotonic() + self._plane.config.consumer.ack_wait_s


class MemoryPlane(AdminPlane):
    def __init__(self, config: DataPlaneConfig | None = None) -> None:
        super().__init__(config or DataPlaneConfig())
        self._streams: dict[str, _Stream] = {}
        self._consumers: dict[str, _Consumer] = {}
        self._changed = asyncio.Condition()
        self._version = 0  # bumped on every change, so a fetcher never misses a wake-up
        self._started = False
        # The weight blobs of this plane (digest -> ref, bytes): the bucket every
        # ``create_weight_store(plane)`` of the process shares, as JetStream blobs are the
        # broker's and not a role's (``broker/weight_blobs/memory.py``).
        self.weight_blobs: dict[str, tuple[BlobRef, bytes]] = {}

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if not self._started:
            await self.provision()
            self._started = True

    async def close(self) -> None:
        self._started = False

    async def provision(
        self, *, update_limits: bool = False, local_store: Path | None = None
    ) -> ProvisionReport:
        # Nothing outlives the process here: no store to keep or check.
        del update_limits, local_store
        created: list[str] = []
        unchanged: list[str] = []
        for spec in self.names.all_streams():
            if spec.name in self._streams:
                unchanged.append(spec.name)
            else:
                self._streams[spec.name] = _Stream(spec)
                created.append(spec.name)
        for consumer in self.names.consumers():
            (unchanged if consumer.durable in self._consumers else created).append(consumer.durable)
            await self.ensure_consumer(consumer)
        return ProvisionReport(tuple(created), (), tuple(unchanged))

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        if spec.durable not in self._consumers:
            self._stream(spec.stream)
            self._consumers[spec.durable] = _Consumer(spec)

    def _stream(self, name: str) -> _Stream:
        try:
            return self._streams[name]
        except KeyError:
            raise KeyError(f"no stream {name!r} (namespace {self.names.namespace!r})") from None

    async def _notify(self) -> None:
        self._version += 1
        async with self._changed:
            self._changed.notify_all()

    # -- producing ---------------------------------------------------------------------------
    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishAck:
        stream = self._stream(self.names.stream_for_subject(subject).name)
        now = time.monotonic()
        window = self.config.streams.duplicate_window_s
        stream.dedupe = {k: v for k, v in stream.dedupe.items() if now - v[1] < window}
        if msg_id in stream.dedupe:
            return PublishAck(stream.spec.name, stream.dedupe[msg_id][0], duplicate=True)
        limits = self.config.streams
        if stream.spec.discard_new and self._would_exceed(stream, len(payload)):
            raise PublishError(
                f"stream {stream.spec.name} is full (max_msgs={limits.max_msgs}, "
                f"max_bytes={limits.max_bytes}); consumers are behind"
            )
        stream.last_seq += 1
        seq = stream.last_seq
        all_headers = dict(headers or {})
        all_headers["Nats-Msg-Id"] = msg_id
        stream.messages[seq] = StoredMessage(
            stream.spec.name, subject, seq, _now(), all_headers, bytes(payload)
        )
        stream.bytes += len(payload)
        stream.dedupe[msg_id] = (seq, now)
        if stream.spec.max_msgs_per_subject > 0:
            self._keep_newest_per_subject(stream, subject)
        while self._would_exceed(stream, 0) and stream.messages:
            self._drop(stream, next(iter(stream.messages)))
        self._expire(stream)
        await self._notify()
        return PublishAck(stream.spec.name, seq, duplicate=False)

    def _would_exceed(self, stream: _Stream, extra_bytes: int) -> bool:
        limits = self.config.streams
        extra_msgs = 1 if extra_bytes else 0
        too_many = limits.max_msgs >= 0 and len(stream.messages) + extra_msgs > limits.max_msgs
        max_bytes = stream.spec.effective_max_bytes(limits.max_bytes)
        too_big = max_bytes >= 0 and stream.bytes + extra_bytes > max_bytes
        return too_many or too_big

    def _expire(self, stream: _Stream) -> None:
        """Drop messages older than the stream's age limit (checked whenever one is added)."""
        max_age = stream.spec.effective_max_age_s(self.config.streams.max_age_s)
        if max_age <= 0:
            return
        oldest_kept = _now() - timedelta(seconds=max_age)
        while stream.messages:
            seq, message = next(iter(stream.messages.items()))
            if message.timestamp >= oldest_kept:
                return
            self._drop(stream, seq)

    def _keep_newest_per_subject(self, stream: _Stream, subject: str) -> None:
        same = self._seqs_on(stream, subject)
        for seq in same[: max(0, len(same) - stream.spec.max_msgs_per_subject)]:
            self._drop(stream, seq)

    @staticmethod
    def _seqs_on(stream: _Stream, subject: str) -> list[int]:
        """Sequences of the stream's messages on ``subject`` (wildcards allowed), oldest first."""
        return [seq for seq, m in stream.messages.items() if subject_matches(subject, m.subject)]

    def _drop(self, stream: _Stream, seq: int) -> None:
        message = stream.messages.pop(seq, None)
        if message is not None:
            stream.bytes -= len(message.data)

    # -- consuming ---------------------------------------------------------------------------
    def _settle(self, consumer: _Consumer, seq: int, *, delete_from_work_queue: bool) -> None:
        consumer.in_flight.pop(seq, None)
        consumer.ready_at.pop(seq, None)
        consumer.num_delivered.pop(seq, None)
        stream = self._streams[consumer.spec.stream]
        if delete_from_work_queue and stream.spec.retention is Retention.WORK_QUEUE:
            self._drop(stream, seq)

    async def fetch(
        self, consumer: ConsumerSpec, batch: int | None = None, timeout_s: float = 1.0
    ) -> list[Delivery]:
        await self.ensure_consumer(consumer)
        state = self._consumers[consumer.durable]
        want = batch or self.config.consumer.fetch_batch
        deadline = time.monotonic() + timeout_s
        while True:
            version = self._version
            deliveries = await self._readable(await self._collect(state, want))
            now = time.monotonic()
            if deliveries or now >= deadline:
                return deliveries
            if version != self._version:
                continue
            wake_at = min([deadline, *self._next_events(state)])
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, wake_at - now)):
                        await self._changed.wait()

    async def _readable(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries as published; one whose headers the plane cannot read is refused
        (dead-lettered with its reason), as on JetStream: headers are input like payloads."""
        out: list[Delivery] = []
        for delivery in deliveries:
            try:
                delivery.headers, delivery.data = await chunking.read(
                    delivery.headers, delivery.data, self._chunk
                )
            except PayloadError as error:
                await self.refuse(delivery, error.reason, str(error))
                continue
            out.append(delivery)
        return out

    async def _chunk(self, ref: str, index: int) -> bytes | None:
        """Chunk ``index`` of ``ref`` (a ``chunking.ChunkReader``): this plane never splits a
        message, but reads a reference like JetStream does, so both refuse the same ones."""
        stream = self._stream(self.names.chunks_stream.name)
        subject = self.names.chunk_subject(ref, index)
        for message in reversed(stream.messages.values()):
            if message.subject == subject:
                return message.data
        return None

    async def _stored(self, message: StoredMessage) -> StoredMessage:
        """A stored message as history readers get it (``chunking.read_stored``)."""
        headers, data = await chunking.read_stored(
            message.headers, message.data, self._chunk, seq=message.seq
        )
        if headers is message.headers and data is message.data:
            return message
        return dataclasses.replace(message, headers=headers, data=data)

    def _next_events(self, state: _Consumer) -> list[float]:
        return [f.deadline for f in state.in_flight.values()] + list(state.ready_at.values())

    async def _collect(self, state: _Consumer, want: int) -> list[Delivery]:
        cfg = self.config.consumer
        stream = self._streams[state.spec.stream]
        now = time.monotonic()
        for seq, flight in list(state.in_flight.items()):
            if flight.deadline <= now:  # ack_wait passed: redeliver
                del state.in_flight[seq]
                state.ready_at[seq] = now
        expired_for_good = [
            seq
            for seq, ready in state.ready_at.items()
            if ready <= now and state.num_delivered.get(seq, 0) >= cfg.max_deliver
        ]
        for seq in expired_for_good:
            await self._dead_letter_max_deliveries(state, stream, seq)

        out: list[Delivery] = []
        for seq, ready in sorted(state.ready_at.items(), key=lambda item: item[1]):
            if len(out) >= want or len(state.in_flight) >= cfg.max_ack_pending:
                return out
            if ready > now:
                continue
            del state.ready_at[seq]
            message = stream.messages.get(seq)
            if message is not None:
                out.append(self._deliver(state, message, now))
        for seq, message in list(stream.messages.items()):
            if len(out) >= want or len(state.in_flight) >= cfg.max_ack_pending:
                break
            if seq <= state.cursor:
                continue
            state.cursor = seq
            if subject_matches(state.spec.filter_subject, message.subject):
                out.append(self._deliver(state, message, now))
        return out

    def _deliver(self, state: _Consumer, message: StoredMessage, now: float) -> Delivery:
        state.num_delivered[message.seq] = state.num_delivered.get(message.seq, 0) + 1
        state.next_token += 1
        state.in_flight[message.seq] = _InFlight(
            now + self.config.consumer.ack_wait_s, state.next_token
        )
        return _MemoryDelivery(self, state, message, state.next_token)

    async def _dead_letter_max_deliveries(
        self, state: _Consumer, stream: _Stream, seq: int
    ) -> None:
        message = stream.messages.get(seq)
        delivered = state.num_delivered.get(seq, 0)
        self._settle(state, seq, delete_from_work_queue=False)
        if message is None:
            return
        log.warning(
            "dead_letter.max_deliveries", stream=stream.spec.name, seq=seq, delivered=delivered
        )
        await self.publish_dead_letter(
            message,
            REASON_MAX_DELIVERIES,
            f"not acknowledged after {delivered} deliveries to consumer {state.spec.durable}",
            delivery_count=delivered,
        )
        if stream.spec.retention is Retention.WORK_QUEUE:
            self._drop(stream, seq)  # as on JetStream: an exhausted prompt leaves the queue

    async def consumer_lag(self, consumer: ConsumerSpec) -> ConsumerLag:
        await self.ensure_consumer(consumer)
        state = self._consumers[consumer.durable]
        stream = self._streams[consumer.stream]
        pending = sum(
            1
            for seq, message in stream.messages.items()
            if seq > state.cursor and subject_matches(consumer.filter_subject, message.subject)
        ) + len(state.ready_at)
        redelivered = sum(1 for seq in state.in_flight if state.num_delivered.get(seq, 0) > 1)
        return ConsumerLag(
            consumer.durable, consumer.stream, pending, len(state.in_flight), redelivered
        )

    # -- reading history ---------------------------------------------------------------------
    async def get(self, stream: str, seq: int) -> StoredMessage:
        try:
            message = self._stream(stream).messages[seq]
        except KeyError:
            raise KeyError(f"stream {stream} has no message {seq}") from None
        return await self._stored(message)

    async def latest(self, subject: str) -> StoredMessage | None:
        stream = self._stream(self.names.stream_for_subject(subject).name)
        for message in reversed(stream.messages.values()):
            if subject_matches(subject, message.subject):
                return await self._stored(message)
        return None

    async def purge(self, subject: str) -> None:
        stream = self._stream(self.names.stream_for_subject(subject).name)
        for seq in self._seqs_on(stream, subject):
            self._drop(stream, seq)

    async def replay(
        self,
        subject: str,
        *,
        from_seq: int | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[StoredMessage]:
        stream = self._stream(self.names.stream_for_subject(subject).name)
        count = 0
        for message in list(stream.messages.values()):
            if limit is not None and count >= limit:
                return
            if from_seq is not None and message.seq < from_seq:
                continue
            if since is not None and message.timestamp < since:
                continue
            if subject_matches(subject, message.subject):
                count += 1
                yield await self._stored(message)

    async def watch(
        self, subject: str, *, include_latest: bool = True
    ) -> AsyncIterator[StoredMessage]:
        stream = self._stream(self.followed_stream(subject))
        latest = await self.latest(subject) if include_latest else None
        if latest is not None:
            yield latest
            position = latest.seq
        else:
            position = stream.last_seq
        while True:
            fresh = [
                m
                for seq, m in stream.messages.items()
                if seq > position and subject_matches(subject, m.subject)
            ]
            if fresh:
                for message in fresh:
                    position = message.seq
                    yield await self._stored(message)
                continue
            position = max(position, stream.last_seq)
            async with self._changed:
                await self._changed.wait()

    async def streams(self) -> list[StreamState]:
        states: list[StreamState] = []
        for stream in self._streams.values():
            messages = list(stream.messages.values())
            lags = [
                await self.consumer_lag(c.spec)
                for c in self._consumers.values()
                if c.spec.stream == stream.spec.name
            ]
            states.append(
                StreamState(
                    name=stream.spec.name,
                    subjects=stream.spec.subjects,
                    retention=stream.spec.retention.value,
                    messages=len(messages),
                    bytes=stream.bytes,
                    first_seq=messages[0].seq if messages else stream.last_seq + 1,
                    last_seq=stream.last_seq,
                    first_time=messages[0].timestamp if messages else None,
                    last_time=messages[-1].timestamp if messages else None,
                    consumers=tuple(lags),
                )
            )
        return states
