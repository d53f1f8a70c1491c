"""Role heartbeats over the data plane, so the fleet can be seen from any machine that reaches
the broker (``dockyard status``, ``dockyard dashboard``).

Every role instance publishes a small JSON record every few seconds to
``NS.heartbeats.<role>.<instance>`` on the heartbeats stream, which keeps one record per subject
and drops it an hour after the last beat: a key-value bucket with a TTL in all but name, kept a
plain stream so that provisioning, the per-role permissions and the in-memory plane treat it like
every other. The file heartbeats (``observability/status_files.py``) stay: the supervisor of
``dockyard run`` and the trainer's readiness check read them without joining the plane.

The record is JSON (not the codec's msgpack) because it is for people and tools (``nats sub``
shows it as is); it is decoded strictly all the same, and a record that does not decode is shown
with its reason, never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec

from dockyard.broker.plane import DataPlane, DataPlaneError, StoredMessage
from dockyard.broker.typed import MessagePlane
from dockyard.observability.status_files import StatusFile
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: Seconds between two beats of one role instance. A reader calls a role silent after
#: ``SILENT_AFTER_BEATS`` missed beats (the record says its own interval, so readers need not
#: share this constant with the roles).
HEARTBEAT_INTERVAL_S = 5.0
SILENT_AFTER_BEATS = 3
HEARTBEAT_SCHEMA = "dockyard.heartbeat/1"
#: States a role's last beat says when it ended on purpose (scorers and rollout workers stop,
#: the trainer finishes): no beat is missed after them.
ENDED_STATES = frozenset({"stopped", "finished"})
#: Heartbeats are small; anything larger is not one (a reader refuses it before decoding).
MAX_HEARTBEAT_BYTES = 64 * 1024

_TOKEN_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class Heartbeat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one role instance says about itself (docs/operations.md, "Fleet status")."""

    schema: str
    role: str
    instance: str
    host: str
    pid: int
    state: str  # starting | running | draining | stopped | unhealthy | failed | finished ...
    detail: str
    #: The weight version the role works with (rollout: loaded; trainer: published), if any.
    weight_version: int | None
    #: Deliveries that decoded and went to the role, and messages it published.
    received: int
    published: int
    #: Deliveries refused at decoding (dead-lettered by reason), and the role's own failures.
    refused: int
    failures: int
    #: Deliveries received per second since the previous beat (None on the first beat).
    received_per_s: float | None
    interval_s: float
    sent_at_unix_s: float
    #: Everything else the role reports in its status (steps, rewards, per-environment counts).
    counters: dict[str, float]


def subject_token(instance: str) -> str:
    """One NATS subject token naming ``instance``: instance ids are ``host-pid`` and host names
    have dots, which split subjects. A changed id gets a digest suffix, so two ids that map to
    the same safe text (``a.b``, ``a_b``) still get two subjects."""
    safe = _TOKEN_UNSAFE.sub("_", instance) or "_"
    if safe == instance:
        return instance
    return f"{safe}-{hashlib.sha256(instance.encode()).hexdigest()[:8]}"


class HeartbeatPublisher:
    """Publishes one role instance's heartbeat: its file status plus what its
    :class:`MessagePlane` counted."""

    def __init__(
        self,
        plane: DataPlane,
        status: StatusFile,
        messages: MessagePlane | None = None,
        *,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.plane = plane
        self.status = status
        self.messages = messages
        self.interval_s = interval_s
        self.clock = clock
        self.subject = plane.names.heartbeat_subject(
            status.status.role, subject_token(status.status.instance)
        )
        self.host = socket.gethostname()
        self.beats = 0
        self._started = clock()
        self._previous: tuple[float, int] | None = None  # (time, received) at the last beat

    def snapshot(self) -> Heartbeat:
        now = self.clock()
        status = self.status.status
        counters = dict(status.counters)
        received = self.messages.received if self.messages else 0
        rate = None
        if self._previous is not None and now > self._previous[0]:
            rate = (received - self._previous[1]) / (now - self._previous[0])
        self._previous = (now, received)
        version = counters.pop("weight_version", None)
        return Heartbeat(
            schema=HEARTBEAT_SCHEMA,
            role=status.role,
            instance=status.instance,
            host=self.host,
            pid=os.getpid(),
            state=status.state,
            detail=status.detail,
            weight_version=None if version is None else int(version),
            received=received,
            published=self.messages.published if self.messages else 0,
            refused=sum(self.messages.dead_lettered.values()) if self.messages else 0,
            failures=int(counters.get("failures", 0)),
            received_per_s=rate,
            interval_s=self.interval_s,
            sent_at_unix_s=now,
            counters=counters,
        )

    async def beat(self) -> None:
        """Publish one heartbeat now. A beat the broker did not take is logged and the next
        one tries again: a heartbeat is never worth stopping a role for."""
        self.beats += 1
        # Unique per beat (the dedupe window would drop a repeated id): start time + count.
        msg_id = f"heartbeat:{self.subject}:{self._started:.6f}:{self.beats}"
        payload = msgspec.json.encode(self.snapshot())
        try:
            await self.plane.publish(self.subject, payload, msg_id=msg_id)
        except DataPlaneError as error:
            log.warning("heartbeat.not_published", subject=self.subject, error=repr(error))

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self.interval_s)


@contextlib.asynccontextmanager
async def publishing_heartbeats(
    plane: DataPlane,
    status: StatusFile,
    messages: MessagePlane | None = None,
    *,
    interval_s: float = HEARTBEAT_INTERVAL_S,
) -> AsyncIterator[HeartbeatPublisher]:
    """Beat while the block runs, and once more when it ends (the role's last state:
    ``stopped``, ``finished``, ``failed``)."""
    publisher = HeartbeatPublisher(plane, status, messages, interval_s=interval_s)
    task = asyncio.create_task(publisher.run(), name=f"heartbeat {publisher.subject}")
    try:
        yield publisher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await publisher.beat()


@dataclass(frozen=True)
class BadHeartbeat:
    """A record on a heartbeat subject that is not a heartbeat, with why."""

    subject: str
    reason: str


def decode_heartbeat(stored: StoredMessage) -> Heartbeat | BadHeartbeat:
    if len(stored.data) > MAX_HEARTBEAT_BYTES:
        return BadHeartbeat(
            stored.subject,
            f"{len(stored.data)} bytes (a heartbeat is at most {MAX_HEARTBEAT_BYTES})",
        )
    try:
        heartbeat = msgspec.json.decode(stored.data, type=Heartbeat)
    except msgspec.DecodeError as error:
        return BadHeartbeat(stored.subject, f"not a heartbeat: {error}")
    if heartbeat.schema != HEARTBEAT_SCHEMA:
        return BadHeartbeat(
            stored.subject, f"schema {heartbeat.schema!r} (this reader knows {HEARTBEAT_SCHEMA})"
        )
    return heartbeat


async def read_heartbeats(plane: DataPlane) -> list[Heartbeat | BadHeartbeat]:
    """Every role instance's last heartbeat still kept (records expire an hour after the last
    beat), in subject order."""
    records = [
        decode_heartbeat(stored) async for stored in plane.replay(plane.names.heartbeats_wildcard)
    ]
    return sorted(records, key=_order)


def _order(record: Heartbeat | BadHeartbeat) -> tuple[str, str]:
    if isinstance(record, BadHeartbeat):
        return ("~", record.subject)  # after the roles
    return (record.role, record.instance)


def is_silent(heartbeat: Heartbeat, now_unix_s: float) -> bool:
    """True when the role missed ``SILENT_AFTER_BEATS`` beats (crashed, hung, cut off).

    A role whose last beat said it ended (:data:`ENDED_STATES`) beats no more by design: it
    is not silent, however old that beat."""
    if heartbeat.state in ENDED_STATES:
        return False
    return now_unix_s - heartbeat.sent_at_unix_s > SILENT_AFTER_BEATS * heartbeat.interval_s
