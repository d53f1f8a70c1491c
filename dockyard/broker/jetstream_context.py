"""nats-py's JetStream context as the plane uses it, and which failures a retry can outlast.

:class:`PipelinedJetStream` fixes two gaps of nats-py's pipelined publishes (a refused one
failing its future, one that never went out giving its slot back); :data:`RETRYABLE` and
:data:`TRANSIENT_API_CODES` say which errors the publishing and reading paths try again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from dockyard.broker.connection import DockyardClient


class AnswerLost(Exception):
    """The connection a request went out on dropped before its answer came."""


RETRYABLE = (
    AnswerLost,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    asyncio.TimeoutError,
)
MAX_BACKOFF_S = 2.0
#: Refusals that pass: 429 "too many requests" (a stream's ingest buffer is full, server ≥ 2.11)
#: and 503 (JetStream briefly unavailable, e.g. during a leader election).
TRANSIENT_API_CODES = frozenset({429, 503})
#: nats-py's bound on pipelined publishes awaiting an ack on one connection, all windows
#: together (its default); past it a publish waits for a free slot, at most ``publish.timeout_s``.
PENDING_PUBLISH_SLOTS = 4000


class _PubAckReply(msgspec.Struct, gc=False):
    """The server's answer to a JetStream publish: an ack, or an error object (the fields
    dockyard reads; others, such as a batch id, are ignored as nats-py ignores them)."""

    stream: str | None = None
    seq: int | None = None
    domain: str | None = None
    duplicate: bool | None = None
    error: dict[str, Any] | None = None


_PUB_ACK = msgspec.json.Decoder(_PubAckReply)
#: The status of a publish no stream listens to (nats-py's ``NO_RESPONDERS_STATUS``).
_NO_RESPONDERS = "503"


class Connected(Protocol):
    """The plane's live connection, as its publisher and history reader reach it (both raise
    :class:`~dockyard.broker.plane.DataPlaneError` while the plane is not started)."""

    @property
    def nc(self) -> DockyardClient: ...

    @property
    def js(self) -> JetStreamContext: ...


class PipelinedJetStream(JetStreamContext):
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
        """nats-py's handler of pipelined acks, its outcome on the future in every case.

        It replaces nats-py's (which raises a refusal instead of setting it, above) rather than
        wrapping it, and reads the ack with one msgspec decode: ``json.loads`` and
        ``PubAck.from_response`` (a walk over the dataclass's fields) cost ≈ 3 µs of CPU per
        publish, ≈ 0.5 µs this way (docs/benchmarks.md, data plane). An ack that cannot be read
        fails its future with the reason (nats-py let the exception escape to its error
        callback and left the publish waiting for the window's timeout)."""
        # nats-py internals (2.x), no public equivalent (the handler is nats-py's own
        # callback): the future waiting on this reply subject.
        prefix = getattr(self, "_async_reply_prefix", None)
        futures = getattr(self, "_publish_async_futures", {})
        future = futures.get(msg.subject[len(prefix) :]) if prefix else None
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get(api.Header.STATUS) == _NO_RESPONDERS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            reply = _PUB_ACK.decode(msg.data)
        except msgspec.DecodeError as error:  # a ValidationError too
            future.set_exception(
                nats.errors.Error(f"unreadable publish ack {msg.data[:200]!r}: {error}")
            )
            return
        if reply.error is not None:
            try:
                APIError.from_error(reply.error)  # raises the error's class (nats.py #985)
            except APIError as refusal:
                future.set_exception(refusal)
            except (KeyError, TypeError) as error:  # an error object without its code
                future.set_exception(
                    nats.errors.Error(f"unreadable publish ack {msg.data[:200]!r}: {error!r}")
                )
            return
        if reply.stream is None or reply.seq is None:
            future.set_exception(
                nats.errors.Error(f"publish ack without stream or seq: {msg.data[:200]!r}")
            )
            return
        future.set_result(
            api.PubAck(
                stream=reply.stream, seq=reply.seq, domain=reply.domain, duplicate=reply.duplicate
            )
        )


def expire_now(deadline: asyncio.Timeout, _: object) -> None:
    """Done-callback of a connection drop: the read under ``deadline`` times out now."""
    with contextlib.suppress(RuntimeError):  # the read ended before this callback ran
        deadline.reschedule(asyncio.get_running_loop().time())
