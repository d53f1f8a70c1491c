"""Pull consumption with a byte cap per request, and the JetStream :class:`Delivery`.

nats-py's ``fetch`` cannot send ``max_bytes``, and a batch whose total exceeds the server's
``max_pending`` gets the client disconnected as a slow consumer (4 × 16 MiB did). So each durable
gets one inbox subscription and we send ``$JS.API.CONSUMER.MSG.NEXT`` requests ourselves with
``max_bytes`` = half of ``max_pending``. Each request has its own reply subject so the status
that ends it (404 no messages, 408 expired, 409 limit reached) is never confused with an older
request's; messages that arrive after a fetch returned wait in the queue for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NotJSMessageError

from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import Delivery
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_STATUS = "Status"
# Headers the server adds to stored messages; the plane hides them from readers.
_SERVER_HEADERS = (
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Stream",
    "Nats-Last-Sequence",
    "Nats-Num-Pending",
)


def user_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (headers or {}).items() if k not in _SERVER_HEADERS}


#: nats-py's errors for a message that did not go out: the connection is closed (the plane is
#: closing), draining, or its outbound buffer is full while reconnecting.
_UNREACHABLE = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
)


class AckSubject(NamedTuple):
    """What a delivery's ack subject says about it (the fields a :class:`Delivery` carries)."""

    stream: str
    seq: int
    num_delivered: int
    timestamp: datetime


#: Token positions in the v2 ack subject (``$JS.ACK.<domain>.<account hash>.<stream>.<consumer>
#: .<delivered>.<stream seq>.<consumer seq>.<time ns>.<pending>[.<token>]``); the v1 form
#: (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time ns>.<pending>``)
#: lacks the domain and account hash, so each field sits two tokens earlier. nats-py's names.
_STREAM, _DELIVERED, _STREAM_SEQ, _TIME = (
    Msg.Ack.Stream,
    Msg.Ack.NumDelivered,
    Msg.Ack.StreamSeq,
    Msg.Ack.Timestamp,
)


def parse_ack_subject(reply: str | None) -> AckSubject:
    """The delivery's stream, stream sequence, delivery count and time from its ack subject.

    What nats-py's ``Msg.metadata`` reads, without its two frozen dataclasses per message
    (about half of a delivery's construction in the benchmark, docs/benchmarks.md); a subject
    of neither form is refused with nats-py's own error, as ``Msg.metadata`` refuses it."""
    tokens = reply.split(".") if reply else []
    if len(tokens) == 9:  # v1
        shift = -2
    elif len(tokens) >= 11:  # v2, with or without the trailing random token
        shift = 0
    else:
        raise NotJSMessageError
    if tokens[0] != "$JS" or tokens[1] != "ACK":
        raise NotJSMessageError
    return AckSubject(
        tokens[_STREAM + shift],
        int(tokens[_STREAM_SEQ + shift]),
        int(tokens[_DELIVERED + shift]),
        datetime.fromtimestamp(int(tokens[_TIME + shift]) / 1e9, UTC),
    )


class JetStreamDelivery(Delivery):
    def __init__(self, msg: Msg, *, data: bytes, headers: Mapping[str, str]) -> None:
        self._msg = msg
        self.stream, self.seq, self.num_delivered, self.timestamp = parse_ack_subject(msg.reply)
        self.subject = msg.subject
        self.headers = dict(headers)
        self.data = data

    async def _ack(self) -> None:
        await self._settle("ack", self._msg.ack)

    async def _nak(self, delay_s: float | None) -> None:
        await self._settle("nak", functools.partial(self._msg.nak, delay=delay_s))

    async def _term(self, reason: str) -> None:
        await self._settle("term", self._msg.term)

    async def _in_progress(self) -> None:
        await self._settle("in_progress", self._msg.in_progress)

    async def _settle(self, how: str, send: Callable[[], Awaitable[None]]) -> None:
        """Send a settle; one that cannot reach the broker is left to redelivery.

        While nats-py reconnects it buffers the settle and sends it on reconnection; it raises
        only when the connection is closed for good (no retry can succeed) or that buffer is
        full (the broker has been away long). Either way the broker still holds the message and
        redelivers it after the ack wait (consumers are idempotent): the role carries on.
        """
        try:
            await send()
        except _UNREACHABLE as error:
            log.warning(
                "settle.unreachable",
                settle=how,
                stream=self.stream,
                subject=self.subject,
                seq=self.seq,
                error=repr(error),
                outcome="left to redelivery after the ack wait",
            )


def is_status(msg: Msg) -> bool:
    return bool(msg.headers) and _STATUS in msg.headers and not msg.data  # type: ignore[operator]  # bool(msg.headers) above: they are a dict


class PullChannel:
    """One durable's inbox: pull requests go out, deliveries and statuses come back."""

    def __init__(
        self, nc: NatsClient, spec: ConsumerSpec, *, api_prefix: str, max_bytes: int
    ) -> None:
        self._nc = nc
        self._spec = spec
        self._max_bytes = max_bytes
        self._prefix = nc.new_inbox()
        self._request_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._subscription: Subscription | None = None
        #: The subscription whose own queue we read (``open``), to account for what we take.
        self._direct: Subscription | None = None
        self._counter = 0

    async def open(self) -> None:
        # The JS messages themselves are bounded by max_bytes per request; lift nats-py's own
        # per-subscription caps so they never drop a delivery silently.
        subscription = await self._nc.subscribe(
            f"{self._prefix}.*", pending_msgs_limit=0, pending_bytes_limit=0
        )
        # Without a callback nats-py leaves the messages in the subscription's own queue
        # (what ``next_msg`` reads): taking them from there saves a second queue and a task
        # switch per message. Its internals (2.x): ``next_msg`` is the public reader, but it
        # starts a timer per message, which is what this avoids; without them, a callback fills
        # our queue.
        queue = getattr(subscription, "_pending_queue", None)
        if isinstance(queue, asyncio.Queue) and hasattr(subscription, "_pending_size"):
            self._queue = queue
            self._subscription = self._direct = subscription
            return
        await subscription.unsubscribe()

        async def on_message(msg: Msg) -> None:
            self._queue.put_nowait(msg)

        self._subscription = await self._nc.subscribe(
            f"{self._prefix}.*", cb=on_message, pending_msgs_limit=0, pending_bytes_limit=0
        )

    async def close(self) -> None:
        if self._subscription is not None:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await self._subscription.unsubscribe()
            self._subscription = None
        # Deliveries that arrived after the last fetch returned were never handed out: give
        # them back now rather than after their ack wait.
        returned = 0
        while not self._queue.empty():
            msg = self._take_nowait()
            if not is_status(msg):
                with contextlib.suppress(Exception):
                    await msg.nak()
                    returned += 1
        if returned:
            log.info("pull.returned_on_close", durable=self._spec.durable, messages=returned)

    def _take_nowait(self) -> Msg:
        return self._taken(self._queue.get_nowait())

    def _taken(self, msg: Msg) -> Msg:
        # What nats-py's ``next_msg`` does with what it hands out (private: no public API lowers
        # a subscription's pending bytes, and without it nats-py would think the queue full).
        if self._direct is not None:
            self._direct._pending_size -= len(msg.data)
            self._queue.task_done()
        return msg

    def _reply(self) -> str:
        self._counter += 1
        return f"{self._prefix}.{self._counter}"

    def _drain(self, out: list[Msg], want: int) -> None:
        while len(out) < want and not self._queue.empty():
            msg = self._take_nowait()
            if not is_status(msg):
                out.append(msg)

    async def _request(self, batch: int, *, no_wait: bool, expires_s: float | None) -> str:
        request: dict[str, object] = {"batch": batch, "max_bytes": self._max_bytes}
        if no_wait:
            request["no_wait"] = True
        if expires_s is not None:
            request["expires"] = int(expires_s * 1e9)
        reply = self._reply()
        await self._nc.publish(self._request_subject, json.dumps(request).encode(), reply=reply)
        return reply

    async def _collect_until(
        self, out: list[Msg], want: int, reply: str, deadline: float, *, stop_on_first: bool
    ) -> None:
        while len(out) < want:
            if self._queue.empty():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                try:
                    async with asyncio.timeout(remaining):
                        msg = self._taken(await self._queue.get())
                except TimeoutError:
                    return
            else:  # already here: no timer
                msg = self._take_nowait()
            if is_status(msg):
                if msg.subject == reply:
                    return  # this request is finished
                continue  # an older request's end
            out.append(msg)
            if stop_on_first:
                self._drain(out, want)
                return

    async def fetch(self, batch: int, timeout_s: float) -> list[Msg]:
        deadline = time.monotonic() + timeout_s
        out: list[Msg] = []
        self._drain(out, batch)
        if len(out) >= batch:
            return out
        # First what is there now, without waiting...
        reply = await self._request(batch - len(out), no_wait=True, expires_s=None)
        await self._collect_until(out, batch, reply, deadline, stop_on_first=False)
        if out or time.monotonic() >= deadline:
            return out
        # ...then a long poll that returns with the first message.
        remaining = deadline - time.monotonic()
        reply = await self._request(batch, no_wait=False, expires_s=remaining)
        await self._collect_until(out, batch, reply, deadline, stop_on_first=True)
        return out
