"""W3C trace context in message headers: each publish and each receipt of a message is an
OpenTelemetry span, and the ``traceparent`` header carries the trace from one role to the next.

A message published in answer to a delivery (a rollout for a prompt group, a scored rollout for
a rollout: ``MessagePlane.publish(..., answers=delivery)``) continues the delivery's trace; a
message that answers none (the dispatcher's prompt groups) starts one. So a group's path
dispatcher -> rollout worker -> scorer -> trainer is one trace, with no role code involved.

Only headers change: message bodies (``dockyard/schemas``) know nothing of tracing. Which spans
are recorded and where they go is the process's tracer provider (``observability/tracing.py``);
without one nothing is recorded and an arriving ``traceparent`` is passed on as it came.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dockyard.schemas import Message, PromptGroup, Rollout, ScoredRollout

HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"
#: W3C trace context only, whatever OTEL_PROPAGATORS says: the header names are part of the
#: wire contract (docs/wire-format.md), not a deployment choice.
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER_NAME = "dockyard.broker"


def _tracer() -> trace.Tracer:
    # Looked up at each use: the process installs its provider after this module is imported.
    return trace.get_tracer(_TRACER_NAME)


def group_of(message: Message) -> str | None:
    if isinstance(message, PromptGroup):
        return message.group_id
    if isinstance(message, Rollout):
        return message.group.group_id
    if isinstance(message, ScoredRollout):
        return message.rollout.group.group_id
    return None


def _attributes(message_type: str, subject: str, stage: str, group: str | None) -> dict[str, str]:
    attributes = {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "dockyard.stage": stage,
        "dockyard.message_type": message_type,
    }
    if group is not None:
        attributes["dockyard.group_id"] = group
    return attributes


def context_of(headers: Mapping[str, str] | None) -> Context | None:
    """The trace context a message carries (None: it carries none)."""
    if not headers or HEADER_TRACEPARENT not in headers:
        return None
    return _PROPAGATOR.extract(headers)


def start_publish_span(
    message: Message,
    subject: str,
    stage: str,
    headers: MutableMapping[str, str],
    answers: Mapping[str, str] | None,
) -> Span:
    """A span for publishing ``message`` (end it once the broker acked), its context written
    into ``headers``; the child of the trace ``answers`` (the answered delivery's headers)
    carries, or a new trace."""
    name = type(message).__name__
    span = _tracer().start_span(
        f"publish {name}",
        context=context_of(answers),
        kind=SpanKind.PRODUCER,
        attributes=_attributes(name, subject, stage, group_of(message)),
    )
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    return span


def end_publish_span(span: Span, error: BaseException | None = None) -> None:
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, repr(error)))
    span.end()


def record_receipt(message: Message, subject: str, stage: str, headers: Mapping[str, str]) -> None:
    """A span for one delivery that decoded and went to the role, in the trace it carries (a
    message that carries none was published untraced: a receipt alone would be a trace of one
    span, and is not recorded)."""
    context = context_of(headers)
    if context is None:
        return
    name = type(message).__name__
    _tracer().start_span(
        f"receive {name}",
        context=context,
        kind=SpanKind.CONSUMER,
        attributes=_attributes(name, subject, stage, group_of(message)),
    ).end()
