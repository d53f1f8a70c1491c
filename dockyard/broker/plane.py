"""The :class:`DataPlane` interface and the value types that cross it.

The plane moves opaque ``(subject, headers, payload bytes)``; the typed layer
(:mod:`dockyard.broker.typed`) puts message models on top through the codec. Two
implementations share these semantics and one contract test suite:
:class:`~dockyard.broker.jetstream.JetStreamPlane` (NATS JetStream, for fleets across machines)
and :class:`~dockyard.broker.memory.MemoryPlane` (one process, what ``data_plane: null`` selects).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Self

from dockyard.broker.dead_letters import build_dead_letter
from dockyard.broker.messages import (
    HEADER_ANSWERS_DELIVERY,
    HEADER_ANSWERS_SEQ,
    HEADER_CHUNK_REF,
    HEADER_CHUNKS,
    HEADER_DEAD_DETAIL,
    HEADER_DEAD_REASON,
    HEADER_MSG_ID,
    HEADER_ORIGINAL_SEQ,
    HEADER_ORIGINAL_STREAM,
    HEADER_ORIGINAL_SUBJECT,
    HEADER_PAYLOAD_SHA256,
    HEADER_PAYLOAD_SIZE,
    HEADER_UNREADABLE,
    PLANE_STAGE,
    REASON_CHUNKS_MISSING,
    REASON_MAX_DELIVERIES,
    OutgoingMessage,
    PublishAck,
    StoredMessage,
)
from dockyard.broker.names import ConsumerSpec, PlaneNames, subject_matches
from dockyard.broker.stream_room import StreamRoom
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.observability.prometheus import DEAD_LETTERS
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

# The message values are defined in messages.py, so that dead_letters (which the plane uses)
# need not import this module back; they are re-exported here with the interface that carries them.
__all__ = [
    "DEAD_LETTER_RETRY_S",
    "HEADER_ANSWERS_DELIVERY",
    "HEADER_ANSWERS_SEQ",
    "HEADER_CHUNKS",
    "HEADER_CHUNK_REF",
    "HEADER_DEAD_DETAIL",
    "HEADER_DEAD_REASON",
    "HEADER_MSG_ID",
    "HEADER_ORIGINAL_SEQ",
    "HEADER_ORIGINAL_STREAM",
    "HEADER_ORIGINAL_SUBJECT",
    "HEADER_PAYLOAD_SHA256",
    "HEADER_PAYLOAD_SIZE",
    "HEADER_UNREADABLE",
    "PLANE_STAGE",
    "REASON_CHUNKS_MISSING",
    "REASON_MAX_DELIVERIES",
    "AlreadySettled",
    "ConsumerLag",
    "DataPlane",
    "DataPlaneError",
    "Delivery",
    "InsufficientStorage",
    "LimitDifference",
    "OutgoingMessage",
    "PayloadError",
    "PermissionDenied",
    "ProvisionReport",
    "ProvisioningDrift",
    "PublishAck",
    "PublishError",
    "StoredMessage",
    "StreamState",
]

#: After a dead letter could not be published: when the refused delivery comes back to be
#: refused again (nothing is lost meanwhile).
DEAD_LETTER_RETRY_S = 5.0


class DataPlaneError(Exception):
    """Base class of every error the plane raises."""


class PublishError(DataPlaneError):
    """A publish was not acknowledged after its retries (broker down, stream full, ...)."""


class StreamFull(PublishError):
    """A stream at its limits refused a message for as long as the publisher waits for room
    (``data_plane.publish.full_stream_wait_s``): its readers have not caught up, or its history
    was not trimmed (see :mod:`dockyard.broker.stream_room`)."""

    def __init__(self, detail: str, *, stream: str) -> None:
        super().__init__(detail)
        self.stream = stream


class PermissionDenied(DataPlaneError):
    """The credentials in use may not publish or subscribe to a subject."""


class ProvisioningDrift(DataPlaneError):
    """An existing stream or consumer differs from what the config asks for."""


class InsufficientStorage(DataPlaneError):
    """The JetStream store cannot reserve the streams' ``max_bytes`` (JetStream reserves each
    file stream's limit up front); the message has the numbers."""


class AlreadySettled(DataPlaneError):
    """A delivery was acked, nak'ed or terminated a second time."""


class PayloadError(DataPlaneError):
    """A message the plane cannot turn into its payload: malformed chunk headers, chunks that
    are gone or fail their integrity check. ``reason`` is the dead letter's reason code."""

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(detail)
        self.reason = reason


class Delivery(abc.ABC):
    """One delivery of a message from a durable pull consumer; settle it exactly once (``ack``,
    ``nak`` or ``term``). ``settled`` says whether it was; settling it again is refused with
    :class:`AlreadySettled` by every implementation (JetStream itself refuses a second ack)."""

    stream: str
    subject: str
    seq: int
    num_delivered: int
    timestamp: datetime
    headers: Mapping[str, str]
    data: bytes
    settled: bool = False

    @property
    def msg_id(self) -> str | None:
        return self.headers.get(HEADER_MSG_ID)

    def as_stored(self) -> StoredMessage:
        return StoredMessage(
            self.stream, self.subject, self.seq, self.timestamp, self.headers, self.data
        )

    async def ack(self) -> None:
        self._refuse_if_settled("ack")
        await self._ack()
        self.settled = True

    async def nak(self, delay_s: float | None = None) -> None:
        """Ask for redelivery, after ``delay_s`` if given."""
        self._refuse_if_settled("nak")
        await self._nak(delay_s)
        self.settled = True

    async def term(self, reason: str = "") -> None:
        """Never redeliver (the message went to dead letters, or is known bad)."""
        self._refuse_if_settled("term")
        await self._term(reason)
        self.settled = True

    async def in_progress(self) -> None:
        """Reset the ack timer: still working on it (nothing to do once settled)."""
        if not self.settled:
            await self._in_progress()

    def _refuse_if_settled(self, how: str) -> None:
        if self.settled:
            raise AlreadySettled(
                f"cannot {how} {self.stream} seq {self.seq}: this delivery is already settled"
            )

    @abc.abstractmethod
    async def _ack(self) -> None: ...

    @abc.abstractmethod
    async def _nak(self, delay_s: float | None) -> None: ...

    @abc.abstractmethod
    async def _term(self, reason: str) -> None: ...

    @abc.abstractmethod
    async def _in_progress(self) -> None: ...


@dataclass(frozen=True)
class ConsumerLag:
    durable: str
    stream: str
    pending: int  # matching messages not yet delivered
    ack_pending: int  # delivered, not yet acked
    redelivered: int  # delivered more than once and not yet acked
    #: The stream sequence up to which every message of the filter is acknowledged (0: none,
    #: or a plane that does not tell).
    ack_floor: int = 0

    @property
    def backlog(self) -> int:
        return self.pending + self.ack_pending


@dataclass(frozen=True)
class StreamState:
    name: str
    subjects: tuple[str, ...]
    retention: str
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    first_time: datetime | None
    last_time: datetime | None
    consumers: tuple[ConsumerLag, ...]


@dataclass(frozen=True)
class LimitDifference:
    """A limit (``data_plane.streams``) in which an existing stream differs from the config."""

    stream: str
    field: str
    existing: object
    configured: object


@dataclass(frozen=True)
class ProvisionReport:
    created: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    #: Existing streams' limits that differ from the config's and were left as they are (a
    #: store is served as it was written; changing them is asked for: ``update_limits``).
    kept: tuple[LimitDifference, ...] = ()
    #: Existing streams' limits changed to the config's (only with ``update_limits``).
    changed: tuple[LimitDifference, ...] = ()


class DataPlane(abc.ABC):
    """Publish, pull and settle, read history, follow weight events: the only way roles
    exchange data, and all a role may do with the broker.

    Use as ``async with plane: ...`` (``start`` + ``close``); ``start`` provisions streams and
    consumers when the config allows it, so every role can start in any order. Provisioning on
    demand, purges and the survey of every stream are the operator's
    (:class:`dockyard.broker.admin.AdminPlane`), out of a role's reach.
    """

    def __init__(self, config: DataPlaneConfig) -> None:
        self.config = config
        self.names = PlaneNames(config.namespace)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    # -- producing ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        msg_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> PublishAck:
        """Publish once: a repeated ``msg_id`` inside the dedupe window is a duplicate."""

    async def publish_many(self, messages: Sequence[OutgoingMessage]) -> list[PublishAck]:
        """Publish several messages; implementations pipeline inside a bounded window."""
        return [
            await self.publish(m.subject, m.payload, msg_id=m.msg_id, headers=m.headers)
            for m in messages
        ]

    # -- consuming ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def fetch(
        self, consumer: ConsumerSpec, batch: int | None = None, timeout_s: float = 1.0
    ) -> list[Delivery]:
        """Up to ``batch`` deliveries, waiting at most ``timeout_s``; ``[]`` when none came."""

    @abc.abstractmethod
    async def consumer_lag(self, consumer: ConsumerSpec) -> ConsumerLag: ...

    async def stream_room(self, stream: str) -> StreamRoom | None:
        """How full ``stream`` is against its limits; None on a plane whose streams have no
        limits (the in-memory plane) or when the stream does not exist."""
        return None

    async def trim_history(self, subject: str, below_seq: int) -> None:
        """Delete ``subject``'s messages below stream sequence ``below_seq`` (history no one
        needs any more, see :mod:`dockyard.broker.stream_room`); a plane without limits keeps
        everything."""
        return None

    async def dead_letter(
        self, delivery: Delivery, reason: str, detail: str, *, stage: str = PLANE_STAGE
    ) -> PublishAck:
        """Move a delivery to the dead-letter stream with its reason, then ``term`` it."""
        ack = await self.publish_dead_letter(
            delivery.as_stored(),
            reason,
            detail,
            stage=stage,
            delivery_count=delivery.num_delivered,
        )
        await delivery.term(reason)
        return ack

    async def refuse(
        self, delivery: Delivery, reason: str, detail: str, *, stage: str = PLANE_STAGE
    ) -> bool:
        """Dead-letter a delivery that cannot be processed and carry on (invariant 5); True
        when it was. When the dead letter cannot be published (the broker away), the delivery
        is given back to come again after ``DEAD_LETTER_RETRY_S`` and be refused then: a
        refusal never fails the fetch that found it, so the rest of a batch still goes on."""
        try:
            await self.dead_letter(delivery, reason, detail, stage=stage)
        except DataPlaneError as failure:
            log.error("dead_letter.failed", seq=delivery.seq, error=repr(failure))
            if not delivery.settled:
                with contextlib.suppress(DataPlaneError):
                    await delivery.nak(DEAD_LETTER_RETRY_S)
            return False
        log.warning(
            "message.dead_lettered",
            stage=stage,
            subject=delivery.subject,
            seq=delivery.seq,
            reason=reason,
            detail=detail,
        )
        return True

    async def publish_dead_letter(
        self,
        original: StoredMessage,
        reason: str,
        detail: str,
        *,
        stage: str = PLANE_STAGE,
        delivery_count: int = 0,
    ) -> PublishAck:
        message = build_dead_letter(
            self.names, original, reason, detail, stage=stage, delivery_count=delivery_count
        )
        ack = await self.publish(
            message.subject, message.payload, msg_id=message.msg_id, headers=message.headers
        )
        if not ack.duplicate:  # several processes reporting one failure make one dead letter
            DEAD_LETTERS.labels(stage, reason).inc()
        return ack

    # -- reading history ---------------------------------------------------------------------
    @abc.abstractmethod
    async def get(self, stream: str, seq: int) -> StoredMessage:
        """One message by stream sequence (``KeyError`` when absent)."""

    @abc.abstractmethod
    async def latest(self, subject: str) -> StoredMessage | None:
        """The last message on a subject (e.g. the current weight-version event)."""

    @abc.abstractmethod
    def replay(
        self,
        subject: str,
        *,
        from_seq: int | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[StoredMessage]:
        """Stored messages on ``subject`` in order, from a sequence or a time; ends at the tail."""

    @abc.abstractmethod
    def watch(self, subject: str, *, include_latest: bool = True) -> AsyncIterator[StoredMessage]:
        """New messages on ``subject`` as they arrive (after the latest one, if asked); endless.
        Only subjects of a stream that announces its messages can be followed
        (:meth:`followed_stream`)."""

    def followed_stream(self, subject: str) -> str:
        """The name of ``subject``'s stream, refusing a subject its stream does not announce
        (``StreamSpec.announces``: weight events, blob manifests and leases): on JetStream a
        watcher wakes on those announcements, and without them it would never see a message."""
        spec = self.names.stream_for_subject(subject)
        if not spec.announces or not subject_matches(spec.announce_filter, subject):
            raise ValueError(
                f"{subject!r} cannot be followed: its stream {spec.name} does not announce what "
                "it stores (only weight events, blob manifests and blob leases are followed; "
                "read the others through a consumer or replay)"
            )
        return spec.name

    async def current_weight_event(self) -> StoredMessage | None:
        return await self.latest(self.names.weight_events)
