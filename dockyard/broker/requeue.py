"""Re-queue dead letters: publish each refused message's original bytes to its original subject.

For after the cause is fixed — a reader upgraded past a schema major it refused, a sandbox
back up, a scorer bug fixed. Each dead letter is re-published at most once per dedupe window
(its id derives from the dead letter's own sequence), and the consumers stay idempotent (the
trainer's seen-set), so re-queueing twice trains nothing twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import (
    HEADER_MSG_ID,
    REASON_CHUNKS_MISSING,
    OutgoingMessage,
    StoredMessage,
)
from dockyard.schemas import CodecError, ReasonCode


@dataclass(frozen=True)
class Requeue:
    dead_letter_seq: int
    reason: str
    message: OutgoingMessage


@dataclass(frozen=True)
class Skipped:
    dead_letter_seq: int
    why: str


def requeue_of(stored: StoredMessage, names: PlaneNames) -> Requeue | Skipped:
    """What re-queueing one stored dead letter would publish, or why it cannot."""
    try:
        letter = read_dead_letter(stored)
    except CodecError as error:
        return Skipped(stored.seq, f"undecodable dead letter ({error.reason.value})")
    if letter.original_payload is None:
        return Skipped(stored.seq, f"original bytes not kept (reference {letter.original_ref})")
    if letter.reason == REASON_CHUNKS_MISSING:
        # What was dead-lettered is the reference to chunks that had aged out: sent back, it
        # would name the same missing chunks and come straight back here.
        return Skipped(stored.seq, "its chunks had aged out: only the reference was left")
    if letter.reason == ReasonCode.BAD_HEADER:
        # Sent back with the same malformed header, it would be refused the same way: no
        # upgrade or fix downstream makes it readable.
        return Skipped(stored.seq, "a malformed header: it would be refused again")
    try:
        names.stream_for_subject(letter.original_subject)
    except KeyError:
        return Skipped(stored.seq, f"{letter.original_subject} is not a subject of this plane")
    headers = {k: v for k, v in letter.original_headers.items() if k != HEADER_MSG_ID}
    original = letter.original_message_id or f"seq{letter.original_stream_seq}"
    message = OutgoingMessage(
        subject=letter.original_subject,
        payload=letter.original_payload,
        msg_id=f"requeue:{stored.seq}:{original}",
        headers=headers,
    )
    return Requeue(stored.seq, letter.reason, message)


async def plan_requeue(
    letters: AsyncIterator[StoredMessage], names: PlaneNames, reasons: frozenset[str]
) -> tuple[list[Requeue], list[Skipped]]:
    """The dead letters to re-queue (only ``reasons``, when given) and those that cannot be."""
    chosen: list[Requeue] = []
    skipped: list[Skipped] = []
    async for stored in letters:
        outcome = requeue_of(stored, names)
        if isinstance(outcome, Skipped):
            skipped.append(outcome)
        elif not reasons or outcome.reason in reasons:
            chosen.append(outcome)
    return chosen, skipped
