"""Stored rollouts scored again, offline, by another environment (``dockyard replay rescore``).

A re-score answers "what would the reward have been with the fixed verifier": the rollouts kept
in the experience stream go through an environment built from the given config, the way a
scorer does it (the same conversion helpers and timeout), and the new scored rollouts are
written under ``NS.rescored.<name>``, never to a subject any role reads. Every stored message
that cannot be re-scored comes back as a :class:`RescoreRefusal` with its reason: none is
skipped silently.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from dockyard.broker.inspect import Undecodable, decode_stored, resolve_subject
from dockyard.broker.names import PlaneNames, subject_matches
from dockyard.broker.plane import OutgoingMessage, StoredMessage
from dockyard.consumers.score_conversion import to_scored_rollout, to_scoring_group
from dockyard.environments.base import Environment, InvalidScoringInput
from dockyard.environments.timeouts import score_with_timeout
from dockyard.schemas import Rollout, ScoredRollout, encode


class RescoreTargetError(ValueError):
    """``--to-subject`` names a subject a re-score must not (or cannot) write to."""


@dataclass(frozen=True)
class RescoreRefusal:
    """A stored message that was not re-scored, and why."""

    seq: int
    reason: str
    detail: str


def rescore_target(names: PlaneNames, subject: str) -> str:
    """The full subject re-scored messages go to. A bare name (``fixed-verifier``) means
    ``NS.rescored.fixed-verifier``; a full subject must be under ``NS.rescored.>``: that is
    the experience stream's subject kept for re-scores (so the messages can be read back), and
    no role reads it. Live subjects and patterns are refused."""
    subject = resolve_subject(names, subject.strip())
    if not subject or any(char in subject for char in "*> \t"):
        raise RescoreTargetError(
            f"--to-subject {subject!r}: give one subject (no wildcards, no spaces)"
        )
    if "." not in subject:
        subject = names.rescored(subject)
    if any(not token for token in subject.split(".")):
        raise RescoreTargetError(f"--to-subject {subject!r}: a subject has no empty tokens")
    for spec in names.all_streams():
        for pattern in spec.subjects:
            if pattern != names.rescored_wildcard and subject_matches(pattern, subject):
                raise RescoreTargetError(
                    f"--to-subject {subject}: a live subject of the plane (stream {spec.name}); "
                    f"re-scores go to {names.rescored_wildcard}"
                )
    if subject_matches(names.stored_notices, subject):
        raise RescoreTargetError(
            f"--to-subject {subject}: the plane's stored-message notices; "
            f"re-scores go to {names.rescored_wildcard}"
        )
    if not subject_matches(names.rescored_wildcard, subject):
        raise RescoreTargetError(
            f"--to-subject {subject}: outside {names.rescored_wildcard}, the experience "
            f"stream's subjects kept for re-scores (give e.g. {names.rescored('NAME')})"
        )
    return subject


async def rescore_each(
    stored: AsyncIterator[StoredMessage],
    environment: Environment,
    tokenizer: object,
    *,
    scorer_id: str,
) -> AsyncIterator[tuple[StoredMessage, ScoredRollout | RescoreRefusal]]:
    """Each stored message with its new score, or the reason it has none. A scored rollout
    is re-scored from the rollout it carries, so ``scored`` can be re-scored as well."""
    async for message in stored:
        decoded = decode_stored(message)
        if isinstance(decoded, Undecodable):
            yield message, RescoreRefusal(message.seq, decoded.reason, decoded.detail)
            continue
        if isinstance(decoded, ScoredRollout):
            decoded = decoded.rollout
        if not isinstance(decoded, Rollout):
            yield (
                message,
                RescoreRefusal(
                    message.seq,
                    "not_a_rollout",
                    f"a {type(decoded).SCHEMA_NAME} message: only rollouts can be re-scored",
                ),
            )
            continue
        try:
            score = await score_with_timeout(environment, to_scoring_group(decoded, tokenizer))
        except InvalidScoringInput as error:
            yield message, RescoreRefusal(message.seq, error.reason_code, str(error))
            continue
        yield message, to_scored_rollout(decoded, score, scorer_id)


def rescored_outgoing(message: ScoredRollout, subject: str) -> OutgoingMessage:
    """``message`` addressed to ``subject``. Its id is prefixed with the subject: the live
    scored message of the same group has the bare id, and the stream's dedupe window would
    otherwise drop the re-score as its duplicate."""
    encoded = encode(message)
    headers = dict(encoded.headers)
    msg_id = headers.pop("Nats-Msg-Id")
    return OutgoingMessage(subject, encoded.payload, f"{subject}:{msg_id}", headers)
