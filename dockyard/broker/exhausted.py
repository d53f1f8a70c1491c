"""Exhausted messages: the ones a durable consumer gave up on (``max_deliver`` reached).

The server announces each with a max-deliveries advisory. Every plane that pulls from the
consumer hears it (``watch``), publishes the dead letter (one message id: the dead-letter stream
keeps one) and removes the message from a work queue, which would otherwise keep it forever; a
plane that finds it removed already has nothing left to do.

An advisory that nobody heard (every puller was down) or whose dead letter could not be
published (the broker went away meanwhile) would leave the message in the work queue, never
delivered again and never dead-lettered. ``sweep`` finds those: while the consumer is idle
(nothing waiting to be delivered, nothing awaiting an ack — a delayed redelivery awaits one),
every message it has delivered that the work queue still holds is exhausted. A plane sweeps when
it starts pulling from a work queue and then every ``SWEEP_INTERVAL_S`` while it pulls.
"""

from __future__ import annotations

import asyncio
import json
from typing import Protocol

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.errors import APIError

from dockyard.broker.connection import DockyardClient
from dockyard.broker.messages import REASON_MAX_DELIVERIES, PublishAck, StoredMessage
from dockyard.broker.names import ConsumerSpec, PlaneNames, Retention
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

ADVISORY_MAX_DELIVERIES = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
#: JetStream's error code for a message sequence that is not (or no longer) in the stream.
NO_MESSAGE_FOUND = 10057
#: How often a plane that pulls from a work queue looks for exhausted messages left behind.
SWEEP_INTERVAL_S = 60.0
#: The most messages one sweep dead-letters (the rest wait for the next sweep).
SWEEP_LIMIT = 1000


class SweptPlane(Protocol):
    """What these functions use of :class:`dockyard.broker.jetstream.JetStreamPlane`, declared
    here so that this module does not import the plane that calls it (imports point one way)."""

    names: PlaneNames

    @property
    def nc(self) -> DockyardClient: ...

    @property
    def js(self) -> JetStreamContext: ...

    async def get(self, stream: str, seq: int) -> StoredMessage: ...

    async def next_stored(
        self, stream: str, subject: str, from_seq: int
    ) -> StoredMessage | None: ...

    async def publish_dead_letter(
        self,
        original: StoredMessage,
        reason: str,
        detail: str,
        *,
        stage: str = ...,
        delivery_count: int = 0,
    ) -> PublishAck: ...


def is_work_queue(plane: SweptPlane, spec: ConsumerSpec) -> bool:
    try:
        stream = plane.names.stream_for_subject(spec.filter_subject)
    except KeyError:
        return False
    return stream.retention is Retention.WORK_QUEUE


async def dead_letter(
    plane: SweptPlane, spec: ConsumerSpec, original: StoredMessage, deliveries: int
) -> None:
    """Publish ``original``'s dead letter and take it out of a work queue."""
    await plane.publish_dead_letter(
        original,
        REASON_MAX_DELIVERIES,
        f"not acknowledged after {deliveries} deliveries to consumer {spec.durable}",
        delivery_count=deliveries,
    )
    if is_work_queue(plane, spec):
        try:
            await plane.js.delete_msg(spec.stream, original.seq)
        except APIError as error:
            if error.err_code != NO_MESSAGE_FOUND:
                raise
    log.warning("dead_letter.max_deliveries", stream=spec.stream, seq=original.seq)


async def watch(plane: SweptPlane, spec: ConsumerSpec) -> Subscription:
    """Turn the server's max-deliveries advisories for ``spec`` into dead letters."""

    async def on_advisory(msg: Msg) -> None:
        try:
            advisory = json.loads(msg.data)
            seq = int(advisory["stream_seq"])
            deliveries = int(advisory.get("deliveries", 0))
            try:
                original = await plane.get(spec.stream, seq)
            except KeyError:
                log.info("dead_letter.already_removed", stream=spec.stream, seq=seq)
                return
            await dead_letter(plane, spec, original, deliveries)
        except Exception as error:  # an advisory must never kill the subscription
            # The message stays in a work queue: the next sweep dead-letters it.
            log.error("dead_letter.advisory_failed", error=repr(error))

    return await plane.nc.subscribe(
        f"{ADVISORY_MAX_DELIVERIES}.{spec.stream}.{spec.durable}", cb=on_advisory
    )


async def sweep(plane: SweptPlane, spec: ConsumerSpec, *, limit: int = SWEEP_LIMIT) -> int:
    """Dead-letter the exhausted messages a work queue still holds; how many it found.

    Only while the consumer is idle: then nothing it delivered is in flight, so whatever it
    delivered and the queue still holds was given up on. A message published after the look
    at the consumer lies past its last delivery and is not touched.
    """
    if not is_work_queue(plane, spec):
        return 0
    info = await plane.js.consumer_info(spec.stream, spec.durable)
    if info.num_pending or info.num_ack_pending:
        return 0
    last_delivered = info.delivered.stream_seq if info.delivered else 0
    max_deliver = info.config.max_deliver or 0
    found = 0
    seq = 1
    while found < limit:
        original = await plane.next_stored(spec.stream, spec.filter_subject, seq)
        if original is None or original.seq > last_delivered:
            break
        await dead_letter(plane, spec, original, max_deliver)
        found += 1
        seq = original.seq + 1
    if found:
        log.warning("dead_letter.swept", stream=spec.stream, consumer=spec.durable, messages=found)
    return found


async def sweep_now(plane: SweptPlane, spec: ConsumerSpec) -> int:
    """``sweep``, where a failure (the broker away, a credential without the rights) is logged
    and left for the next sweep: it must never stop the role that pulls."""
    try:
        return await sweep(plane, spec)
    except Exception as error:
        log.warning("dead_letter.sweep_failed", consumer=spec.durable, error=repr(error))
        return 0


async def sweep_periodically(plane: SweptPlane, spec: ConsumerSpec) -> None:
    """``sweep_now`` every ``SWEEP_INTERVAL_S`` until cancelled."""
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        await sweep_now(plane, spec)
