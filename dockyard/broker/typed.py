"""Message models on top of the byte-moving plane: publish through the codec, fetch + decode.

This is the layer roles use. A delivery that does not decode (corrupt frame, wrong schema,
unsupported version, non-finite values, ...) never reaches the role: it is dead-lettered with the
codec's reason code, ``term``-ed, counted, and the fetch carries on with the next message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from opentelemetry.trace import Span

from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import (
    HEADER_ANSWERS_DELIVERY,
    HEADER_ANSWERS_SEQ,
    DataPlane,
    Delivery,
    OutgoingMessage,
    PublishAck,
    StoredMessage,
)
from dockyard.broker.trace_context import end_publish_span, record_receipt, start_publish_span
from dockyard.observability.prometheus import DECODE_FAILURES, MESSAGES_PUBLISHED, MESSAGES_RECEIVED
from dockyard.schemas import (
    DEFAULT_LIMITS,
    CodecError,
    DeadLetter,
    DecodeLimits,
    Message,
    PromptGroup,
    Rollout,
    ScoredRollout,
    WeightVersion,
    decode,
    encode,
)
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

M = TypeVar("M", bound=Message)


@dataclass
class Received(Generic[M]):
    """A decoded message with the delivery to settle (``ack`` once it is processed)."""

    message: M
    delivery: Delivery

    async def ack(self) -> None:
        await self.delivery.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        await self.delivery.nak(delay_s)

    async def in_progress(self) -> None:
        await self.delivery.in_progress()


class MessagePlane:
    """Typed access to a :class:`DataPlane` for one stage (the name recorded in dead letters)."""

    def __init__(
        self, plane: DataPlane, *, stage: str, limits: DecodeLimits = DEFAULT_LIMITS
    ) -> None:
        self.plane = plane
        self.names = plane.names
        self.stage = stage
        self.limits = limits
        self.dead_lettered: Counter[str] = Counter()  # by reason code
        # This instance's own totals (the Prometheus counters are per process, and
        # ``dockyard run`` may host several roles in one): what its heartbeat reports.
        self.received = 0  # deliveries that decoded and went to the role
        self.published = 0

    def subject_for(self, message_type: type[Message]) -> str:
        subjects: dict[type[Message], str] = {
            PromptGroup: self.names.prompts,
            Rollout: self.names.rollouts,
            ScoredRollout: self.names.scored,
            WeightVersion: self.names.weight_events,
            DeadLetter: self.names.dead_letters,
        }
        try:
            return subjects[message_type]
        except KeyError:
            raise TypeError(f"no subject carries {message_type.__name__}") from None

    def _outgoing(
        self, message: Message, answers: Delivery | None = None
    ) -> tuple[OutgoingMessage, Span]:
        """The message to publish, and its publish span (end it with the publish): its trace
        context goes into the headers, continuing the answered delivery's trace."""
        encoded = encode(message)
        headers = dict(encoded.headers)
        msg_id = headers.pop("Nats-Msg-Id")
        if answers is not None:
            headers[HEADER_ANSWERS_SEQ] = str(answers.seq)
            headers[HEADER_ANSWERS_DELIVERY] = str(answers.num_delivered)
        subject = self.subject_for(type(message))
        span = start_publish_span(
            message, subject, self.stage, headers, answers.headers if answers else None
        )
        return OutgoingMessage(subject, encoded.payload, msg_id, headers), span

    async def publish(self, message: Message, *, answers: Delivery | None = None) -> PublishAck:
        """Publish ``message``; ``answers`` is the delivery it was made from (its provenance is
        stored in the message's headers for ``replay trace``, and its trace continues)."""
        out, span = self._outgoing(message, answers)
        try:
            ack = await self.plane.publish(
                out.subject, out.payload, msg_id=out.msg_id, headers=out.headers
            )
        except BaseException as error:
            end_publish_span(span, error)
            raise
        end_publish_span(span)
        MESSAGES_PUBLISHED.labels(self.stage, type(message).__name__).inc()
        self.published += 1
        return ack

    async def publish_many(
        self, messages: Sequence[Message], *, answers: Sequence[Delivery] | None = None
    ) -> list[PublishAck]:
        if answers is not None and len(answers) != len(messages):
            raise ValueError(f"{len(answers)} deliveries answered by {len(messages)} messages")
        sources: Sequence[Delivery | None] = answers or [None] * len(messages)
        built = [self._outgoing(m, a) for m, a in zip(messages, sources, strict=True)]
        try:
            acks = await self.plane.publish_many([out for out, _span in built])
        except BaseException as error:
            for _out, span in built:
                end_publish_span(span, error)
            raise
        for _out, span in built:
            end_publish_span(span)
        for message in messages:
            MESSAGES_PUBLISHED.labels(self.stage, type(message).__name__).inc()
        self.published += len(messages)
        return acks

    @contextlib.asynccontextmanager
    async def kept_in_progress(self, items: Sequence[Received[M]]) -> AsyncIterator[None]:
        """While the block runs, tell the broker every third of the ack wait that the unsettled
        ``items`` are still being worked on (two beats may be late before it gives them away),
        so work longer than the ack wait (a slow environment, a long generation) is not
        redelivered to another consumer and done twice."""
        every_s = self.plane.config.consumer.ack_wait_s / 3

        async def beat() -> None:
            while True:
                await asyncio.sleep(every_s)
                for item in items:
                    if item.delivery.settled:
                        continue
                    try:
                        await item.in_progress()
                    except Exception as error:  # a missed beat only risks a redelivery
                        log.warning("in_progress.failed", seq=item.delivery.seq, error=repr(error))

        beating = asyncio.create_task(beat())
        try:
            yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def retry_later(
        self,
        item: Received[M],
        reason: str,
        error: BaseException,
        *,
        base_delay_s: float,
        max_deliver: int,
        stage: str,
    ) -> bool:
        """Give back an item whose processing failed: nak'ed with a delay that doubles with each
        delivery, or, at its last delivery, dead-lettered with ``reason`` and the error. True
        when it was dead-lettered."""
        delivery = item.delivery
        if delivery.num_delivered >= max_deliver:
            await self.plane.dead_letter(delivery, reason, repr(error), stage=stage)
            return True
        await item.nak(base_delay_s * 2 ** (delivery.num_delivered - 1))
        return False

    async def fetch(
        self,
        consumer: ConsumerSpec,
        expected: type[M],
        *,
        batch: int | None = None,
        timeout_s: float = 1.0,
    ) -> list[Received[M]]:
        out: list[Received[M]] = []
        for delivery in await self.plane.fetch(consumer, batch, timeout_s):
            try:
                message = decode(
                    delivery.headers, delivery.data, limits=self.limits, expected=expected
                )
            except CodecError as error:
                DECODE_FAILURES.labels(self.stage, error.reason.value).inc()
                # When the dead letter cannot be published the delivery comes back later (and
                # is refused again); the good messages of this batch still go to the role.
                if await self.plane.refuse(
                    delivery, error.reason.value, error.detail, stage=self.stage
                ):
                    self.dead_lettered[error.reason.value] += 1
                continue
            record_receipt(message, delivery.subject, self.stage, delivery.headers)
            out.append(Received(message, delivery))
        if out:
            MESSAGES_RECEIVED.labels(self.stage, expected.__name__).inc(len(out))
            self.received += len(out)
        return out

    async def current_weight_version(self) -> WeightVersion | None:
        """The newest weight-version event that decodes (None when there is none)."""
        stored = await self.plane.current_weight_event()
        if stored is None:
            return None
        current = self._weight_version_in(stored)
        if current is not None:
            return current
        # The newest event is poison: read back to the newest good one. Failing here instead
        # would stop a trainer on every restart; taking "none" would publish versions again.
        async for older in self.plane.replay(self.names.weight_events):
            event = self._weight_version_in(older)
            if event is not None:
                current = event
        return current

    def _weight_version_in(self, stored: StoredMessage) -> WeightVersion | None:
        try:
            return decode(stored.headers, stored.data, limits=self.limits, expected=WeightVersion)
        except CodecError as error:
            log.error("weight_event.undecodable", seq=stored.seq, reason=error.reason.value)
            return None

    async def weight_versions(self) -> AsyncIterator[WeightVersion]:
        """The current weight version, then every new one; undecodable events are skipped."""
        first = True
        async for stored in self.plane.watch(self.names.weight_events):
            event = self._weight_version_in(stored)
            if event is None and first:
                # The newest event is poison: start from the newest good one rather than wait
                # for the next version (a worker that starts now would have no weights).
                event = await self.current_weight_version()
            first = False
            if event is not None:
                yield event
