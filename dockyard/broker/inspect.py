"""Summaries of stored messages for people debugging a run (``dockyard replay``).

Decoding goes through the codec; a message that does not decode is summarised as such, with
the codec's reason (or the plane's, for one it could not read: ``HEADER_UNREADABLE``), never
skipped.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
import numpy as np

from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import HEADER_UNREADABLE, StoredMessage
from dockyard.schemas import (
    CodecError,
    DeadLetter,
    Message,
    PromptGroup,
    Rollout,
    ScoredRollout,
    WeightVersion,
    decode,
)

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def resolve_subject(names: PlaneNames, subject: str) -> str:
    """Short names (prompts, rollouts, scored, weights, dead) or a full subject."""
    short = {
        "prompts": names.prompts,
        "rollouts": names.rollouts,
        "scored": names.scored,
        "weights": names.weight_events,
        "dead": names.dead_letters,
    }
    return short.get(subject, subject)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """ISO-8601 (``2025-01-31T12:00:00Z``) or relative (``90s``, ``10m``, ``2h``, ``1d``)."""
    match = _RELATIVE.match(text.strip())
    if match:
        amount, unit = match.groups()
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[unit]: float(amount)})
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"--since {text!r}: use ISO-8601 or a relative time like 10m") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Undecodable:
    reason: str
    detail: str


def decode_stored(stored: StoredMessage) -> Message | Undecodable:
    """The message, or why there is none: the plane's reason for a message it could not read
    (its body is empty then, and the codec would only say so), else the codec's."""
    unreadable = stored.headers.get(HEADER_UNREADABLE)
    if unreadable is not None:
        reason, _, detail = unreadable.partition(": ")
        return Undecodable(reason, detail)
    try:
        return decode(stored.headers, stored.data)
    except CodecError as error:
        return Undecodable(error.reason.value, error.detail)


@dataclass
class MessageSummary:
    seq: int
    time: datetime
    subject: str
    schema: str
    group_id: str = ""
    environment: str = ""
    weight_version: str = ""
    staleness: str = ""
    rewards: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    note: str = ""
    decoded: Message | None = None


def _version_range(versions: Sequence[int]) -> str:
    if not versions:
        return ""
    low, high = min(versions), max(versions)
    return str(low) if low == high else f"{low}..{high}"


def _rollout_fields(summary: MessageSummary, rollout: Rollout, current: int | None) -> None:
    summary.group_id = rollout.group.group_id
    summary.environment = rollout.group.environment
    samples = rollout.samples
    versions = samples.token_weight_versions
    if versions.size:
        low = int(versions.min())
        summary.weight_version = _version_range((low, int(versions.max())))
        if current is not None:
            summary.staleness = str(current - low)
    summary.lengths = list(samples.response_lengths)


def summarise(stored: StoredMessage, current_version: int | None = None) -> MessageSummary:
    summary = MessageSummary(stored.seq, stored.timestamp, stored.subject, schema="")
    message = decode_stored(stored)
    if isinstance(message, Undecodable):
        summary.schema = "<undecodable>"
        summary.note = f"{message.reason}: {message.detail}"[:160]
        return summary
    summary.decoded = message
    summary.schema = type(message).SCHEMA_NAME
    if isinstance(message, PromptGroup):
        summary.group_id = message.group_id
        summary.environment = message.environment
        summary.weight_version = str(message.dispatch_weight_version)
        if current_version is not None:
            summary.staleness = str(current_version - message.dispatch_weight_version)
    elif isinstance(message, Rollout):
        _rollout_fields(summary, message, current_version)
    elif isinstance(message, ScoredRollout):
        _rollout_fields(summary, message.rollout, current_version)
        summary.rewards = list(message.scores.reward)
    elif isinstance(message, WeightVersion):
        summary.weight_version = str(message.version)
        summary.note = f"{message.digest[:19]}… {message.nbytes} B"
    elif isinstance(message, DeadLetter):
        summary.note = f"{message.stage}: {message.reason}: {message.message}"[:160]
    return summary


def export_record(stored: StoredMessage) -> dict[str, object]:
    """One JSON-serialisable line of ``replay export``."""
    record: dict[str, object] = {
        "stream": stored.stream,
        "seq": stored.seq,
        "subject": stored.subject,
        "time": stored.timestamp.isoformat(),
        "headers": dict(stored.headers),
    }
    message = decode_stored(stored)
    if isinstance(message, Undecodable):
        record["error"] = {"reason": message.reason, "detail": message.detail}
        record["payload_base64"] = base64.b64encode(stored.data).decode()
        return record
    record["schema"] = type(message).SCHEMA_NAME
    record["message"] = _readable(message)
    return record


def _readable(message: Message) -> dict[str, object]:
    """``message`` as people read it, as JSON values: a group as one map per sample and per
    score (its rows, the same content), not the wire's columns, so that
    ``jq '.message.scores[].reward'`` reads one reward per sample."""
    readable = _as_json(message)
    if isinstance(message, ScoredRollout | Rollout):
        rows = "scores" if isinstance(message, ScoredRollout) else "samples"
        if isinstance(message, ScoredRollout):
            readable["rollout"] = _readable(message.rollout)
        readable[rows] = [_as_json(row) for row in getattr(message, rows)]
    return readable


def _as_json(value: object) -> dict[str, object]:
    """A struct as JSON values: arrays as lists, bytes as base64 (msgspec's rule)."""
    return msgspec.to_builtins(value, enc_hook=_array_as_list)  # type: ignore[no-any-return]  # to_builtins returns Any; a struct gives a dict


def _array_as_list(value: object) -> object:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise NotImplementedError(f"{type(value).__name__} has no JSON form")
