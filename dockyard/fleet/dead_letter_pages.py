"""Dead letters a page at a time, newest first, for the dashboard's message browser.

Each one is decoded with the replay decoder (``broker/inspect.py``): its stage, reason and
detail, and a summary of the message it refused (schema, group), or why either does not decode.
Pages are ranges of the dead-letter stream's sequence: ``before`` is where the older page starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from dockyard.broker.admin import AdminPlane, stream_state
from dockyard.broker.inspect import Undecodable, decode_stored, summarise
from dockyard.broker.plane import StoredMessage
from dockyard.schemas import DeadLetter

MAX_PAGE_SIZE = 200


@dataclass(frozen=True)
class DeadLetterPage:
    items: list[dict[str, object]]
    #: The ``before`` of the next older page (None: this is the oldest), and how many are stored.
    older_before: int | None
    stored: int

    def to_json(self) -> dict[str, object]:
        return {"items": self.items, "older_before": self.older_before, "stored": self.stored}


def _row(stored: StoredMessage) -> dict[str, object]:
    row: dict[str, object] = {"seq": stored.seq, "time": stored.timestamp.isoformat()}
    letter = decode_stored(stored)
    if not isinstance(letter, DeadLetter):
        reason = letter.reason if isinstance(letter, Undecodable) else type(letter).__name__
        detail = letter.detail if isinstance(letter, Undecodable) else "not a dead letter"
        return {**row, "error": f"{reason}: {detail}"}
    row.update(
        stage=letter.stage,
        reason=letter.reason,
        detail=letter.message,
        delivery_count=letter.delivery_count,
        original_subject=letter.original_subject,
        original_seq=letter.original_stream_seq,
    )
    if letter.original_payload is not None:
        original = StoredMessage(
            stream="",
            subject=letter.original_subject,
            seq=letter.original_stream_seq or 0,
            timestamp=stored.timestamp,
            headers=letter.original_headers,
            data=letter.original_payload,
        )
        summary = summarise(original)
        row.update(original_schema=summary.schema, group_id=summary.group_id, note=summary.note)
    return row


async def dead_letter_page(plane: AdminPlane, *, before: int | None, size: int) -> DeadLetterPage:
    """The ``size`` newest dead letters stored before sequence ``before`` (all, when None)."""
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page size {size}: give 1 to {MAX_PAGE_SIZE}")
    name = plane.names.dead_letters_stream.name
    state = await stream_state(plane, name)
    if state is None or state.messages == 0:
        return DeadLetterPage([], None, 0)
    last = state.last_seq if before is None else min(before - 1, state.last_seq)
    start = max(state.first_seq, last - size + 1)
    rows = [
        _row(stored)
        async for stored in plane.replay(plane.names.dead_letters, from_seq=start, limit=size)
        if stored.seq <= last
    ]
    older = start if start > state.first_seq else None
    return DeadLetterPage(rows[::-1], older, state.messages)
