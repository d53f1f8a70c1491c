"""The lineage of one group (``dockyard replay trace``), from what the run stored.

Sources: the prompts stream (a work queue: a prompt is there only until a worker acks it), the
experience stream (its rollout and scored rollout, each naming the delivery it answered in the
``Dockyard-Answers-*`` headers), the dead letters, and the trainer's ``ledger.jsonl`` (trained at
which step, or dropped and why). Messages are matched by their message id
(``schema:group:attempt``), so nothing but the group's own messages is decoded; one that does not
decode is listed with the reason, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from dockyard.broker.inspect import Undecodable, decode_stored
from dockyard.broker.messages import decimal_header
from dockyard.broker.plane import (
    HEADER_ANSWERS_DELIVERY,
    HEADER_ANSWERS_SEQ,
    StoredMessage,
)
from dockyard.schemas import DeadLetter, PromptGroup, Rollout, ScoredRollout
from dockyard.schemas.prompt import group_id_of

_GROUP_SCHEMAS = (PromptGroup.SCHEMA_NAME, Rollout.SCHEMA_NAME, ScoredRollout.SCHEMA_NAME)


@dataclass
class TraceEvent:
    """One thing that happened to the group, with where it is stored."""

    what: str  # prompt | rollout | scored | dead_letter | trained | dropped | open_at_end
    time: str | None  # ISO-8601, the stream's timestamp (None for ledger events)
    stream: str | None = None
    seq: int | None = None
    attempt: int | None = None
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class GroupTrace:
    group_id: str
    events: list[TraceEvent] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.events)

    def to_json(self) -> dict[str, object]:
        return {"group_id": self.group_id, "events": [asdict(e) for e in self.events]}


def _answered(stored: StoredMessage) -> dict[str, object]:
    """Which delivery of its input the message answered; earlier deliveries were not answered."""
    # ASCII decimal (``str.isdigit`` takes "²", which ``int`` then refuses): malformed is unknown.
    seq = decimal_header(stored.headers.get(HEADER_ANSWERS_SEQ))
    count = decimal_header(stored.headers.get(HEADER_ANSWERS_DELIVERY))
    if seq is None or count is None:
        return {"answered": "unknown (no provenance headers)"}
    return {"answered_seq": seq, "answered_delivery": count}


def _time(stored: StoredMessage) -> str:
    return stored.timestamp.isoformat()


def _group_event(stored: StoredMessage) -> TraceEvent:
    message = decode_stored(stored)
    if isinstance(message, Undecodable):
        return TraceEvent(
            "undecodable",
            _time(stored),
            stored.stream,
            stored.seq,
            detail={"reason": message.reason, "detail": message.detail},
        )
    if isinstance(message, PromptGroup):
        return TraceEvent(
            "prompt",
            _time(stored),
            stored.stream,
            stored.seq,
            message.attempt,
            _prompt_detail(message) | {"waiting": "not yet acked by a worker"},
        )
    if isinstance(message, Rollout):
        return TraceEvent(
            "rollout",
            _time(stored),
            stored.stream,
            stored.seq,
            message.group.attempt,
            _rollout_detail(message) | _answered(stored),
        )
    if isinstance(message, ScoredRollout):
        # Its rollout rides inside: the worker and weights are known even when the rollout
        # itself has aged out of the stream (or was never stored alone).
        detail: dict[str, object] = _rollout_detail(message.rollout) | {
            "scorer": message.scorer_id,
            "environment": message.rollout.group.environment,
            "rewards": [float(r) for r in message.scores.reward],
            "scored_at_unix_s": message.scored_at_unix_s,
        }
        return TraceEvent(
            "scored",
            _time(stored),
            stored.stream,
            stored.seq,
            message.rollout.group.attempt,
            detail | _answered(stored),
        )
    return TraceEvent(type(message).SCHEMA_NAME, _time(stored), stored.stream, stored.seq)


def _prompt_detail(group: PromptGroup) -> dict[str, object]:
    position = group.dataset_position
    return {
        "dataset": position.dataset,
        "epoch": position.epoch,
        "index": position.index,
        "environment": group.environment,
        "dispatch_weight_version": group.dispatch_weight_version,
        "dispatched_at_unix_s": group.created_at_unix_s,
    }


def _rollout_detail(rollout: Rollout) -> dict[str, object]:
    samples = rollout.samples
    versions = samples.token_weight_versions
    return {
        "prompt": _prompt_detail(rollout.group),
        "workers": sorted(set(samples.worker_id)),
        "weight_versions": sorted({int(v) for v in versions}) if versions.size else [],
        "response_lengths": [int(n) for n in samples.response_lengths],
        "created_at_unix_s": rollout.created_at_unix_s,
    }


def _dead_event(stored: StoredMessage, group_id: str) -> TraceEvent | None:
    letter = decode_stored(stored)
    if not isinstance(letter, DeadLetter):
        return None
    if group_id_of(letter.original_message_id or "", _GROUP_SCHEMAS) != group_id:
        return None
    return TraceEvent(
        "dead_letter",
        _time(stored),
        stored.stream,
        stored.seq,
        detail={
            "stage": letter.stage,
            "reason": letter.reason,
            "message": letter.message,
            "original_subject": letter.original_subject,
            "original_seq": letter.original_stream_seq,
            "delivery_count": letter.delivery_count,
        },
    )


def _ledger_events(events: Iterable[dict[str, object]], group_id: str) -> list[TraceEvent]:
    out = []
    for event in events:
        if event.get("group_id") != group_id or event.get("event") == "dispatched":
            continue
        kind = str(event["event"])
        detail = {k: v for k, v in event.items() if k not in ("event", "group_id")}
        out.append(TraceEvent(kind, None, detail=detail))
    return out


def trace_group(
    group_id: str,
    messages: Iterable[StoredMessage],
    dead_letters: Iterable[StoredMessage],
    ledger: Iterable[dict[str, object]] | None,
) -> GroupTrace:
    """``messages``: the prompts' and experience streams' messages in stream order."""
    trace = GroupTrace(group_id)
    for stored in messages:
        if group_id_of(stored.msg_id or "", _GROUP_SCHEMAS) == group_id:
            trace.events.append(_group_event(stored))
    for stored in dead_letters:
        # The dead letter's own id is not the group's: its body names the original message.
        event = _dead_event(stored, group_id)
        if event is not None:
            trace.events.append(event)
    trace.events.sort(key=lambda e: e.time or "")
    trace.events += _ledger_events(ledger or (), group_id)
    return trace


def render(trace: GroupTrace, ledger_read: bool) -> str:
    """The trace as people read it: one line per event, with its stream and sequence."""
    if not trace.found:
        return f"group {trace.group_id}: nothing stored (aged out, or not this namespace)"
    lines = [f"group {trace.group_id}"]
    for event in trace.events:
        where = f"{event.stream}#{event.seq}" if event.stream else "ledger.jsonl"
        when = (
            datetime.fromisoformat(event.time).isoformat(timespec="milliseconds")
            if event.time
            else "-"
        )
        attempt = f" attempt {event.attempt}" if event.attempt is not None else ""
        lines.append(f"  {when}  {event.what:<12} {where}{attempt}")
        lines += [f"      {key}: {value}" for key, value in _describe(event).items()]
    if not ledger_read:
        lines.append("  (no --run-dir: whether it was trained or dropped is not shown)")
    elif not any(e.what in ("trained", "dropped", "open_at_end") for e in trace.events):
        lines.append("  ledger: not trained or dropped yet (still in flight)")
    return "\n".join(lines)


def _describe(event: TraceEvent) -> dict[str, object]:
    detail = dict(event.detail)
    delivery = detail.pop("answered_delivery", None)
    if delivery is not None:
        source = "prompt" if event.what == "rollout" else "rollout"
        seq = detail.pop("answered_seq")
        earlier = int(delivery) - 1  # type: ignore[call-overload]  # an event detail's delivery count (JSON)
        detail["answered"] = f"{source} #{seq}, delivery {delivery}" + (
            f" ({earlier} earlier deliveries not answered: nak'ed or timed out)" if earlier else ""
        )
    return detail
