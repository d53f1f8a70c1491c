"""Dead letters: where a message goes when it cannot be processed, with its reason.

A dead letter is a :class:`~dockyard.schemas.DeadLetter` message (encoded by the codec like any
other) that keeps the original bytes verbatim, plus triage headers (reason, detail, original
subject/stream/sequence) so it can be sorted without decoding. Its ``Nats-Msg-Id`` is the
model's deterministic id, so several processes reporting the same failure (every scorer of a
pool sees the max-deliveries advisory) produce one dead letter.
"""

from __future__ import annotations

import time

from dockyard.broker.messages import (
    HEADER_DEAD_DETAIL,
    HEADER_DEAD_REASON,
    HEADER_MSG_ID,
    HEADER_ORIGINAL_SEQ,
    HEADER_ORIGINAL_STREAM,
    HEADER_ORIGINAL_SUBJECT,
    PLANE_STAGE,
    OutgoingMessage,
    StoredMessage,
)
from dockyard.broker.names import PlaneNames
from dockyard.schemas import DeadLetter, decode, encode

# NATS header values are one line; long details are cut in the header, kept whole in the body.
MAX_HEADER_DETAIL_CHARS = 512


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MAX_HEADER_DETAIL_CHARS]


def build_dead_letter(
    names: PlaneNames,
    original: StoredMessage,
    reason: str,
    detail: str,
    *,
    stage: str = PLANE_STAGE,
    delivery_count: int = 0,
) -> OutgoingMessage:
    letter = DeadLetter(
        original_subject=original.subject,
        original_headers=dict(original.headers),
        original_payload=original.data,
        # An empty id is no id: as an identity it would give every such message's dead letter
        # the same Nats-Msg-Id, and all but the first would be dropped as duplicates.
        original_message_id=original.headers.get(HEADER_MSG_ID) or None,
        original_stream_seq=original.seq,
        stage=stage,
        reason=reason[:64],
        message=detail,
        delivery_count=delivery_count,
        created_at_unix_s=time.time(),
    )
    encoded = encode(letter)
    headers = dict(encoded.headers)
    headers.update(
        {
            HEADER_DEAD_REASON: reason,
            HEADER_DEAD_DETAIL: _one_line(detail),
            HEADER_ORIGINAL_SUBJECT: original.subject,
            HEADER_ORIGINAL_STREAM: original.stream,
            HEADER_ORIGINAL_SEQ: str(original.seq),
        }
    )
    return OutgoingMessage(
        subject=names.dead_letters,
        payload=encoded.payload,
        msg_id=headers.pop(HEADER_MSG_ID),
        headers=headers,
    )


def read_dead_letter(stored: StoredMessage) -> DeadLetter:
    return decode(stored.headers, stored.data, expected=DeadLetter)
