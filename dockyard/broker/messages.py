"""The values that cross the data plane: header names, reason codes and message records.

They live apart from :mod:`dockyard.broker.plane` (which re-exports them) so that modules the plane
itself uses, such as :mod:`dockyard.broker.dead_letters`, can build messages without importing
the plane back: imports point one way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

HEADER_MSG_ID = "Nats-Msg-Id"
# Oversized messages travel by reference to the chunk stream (see chunking.py).
HEADER_CHUNKS = "Dockyard-Chunks"
HEADER_CHUNK_REF = "Dockyard-Chunk-Ref"
HEADER_PAYLOAD_SIZE = "Dockyard-Payload-Size"
HEADER_PAYLOAD_SHA256 = "Dockyard-Payload-Sha256"
#: On a message read from history that the plane could not turn into its payload (chunks gone,
#: malformed chunk headers): ``<reason code>: <detail>``, and why its body is empty. The plane
#: sets it and never publishes it; one that arrives with a message is dropped on reading.
HEADER_UNREADABLE = "Dockyard-Unreadable"
# Set on every dead letter so it can be triaged without decoding its body.
HEADER_DEAD_REASON = "Dockyard-Dead-Reason"
HEADER_DEAD_DETAIL = "Dockyard-Dead-Detail"
HEADER_ORIGINAL_SUBJECT = "Dockyard-Original-Subject"
HEADER_ORIGINAL_STREAM = "Dockyard-Original-Stream"
HEADER_ORIGINAL_SEQ = "Dockyard-Original-Seq"
# On a message a role produced in answer to a delivery (a rollout for a prompt, a scored rollout
# for a rollout): that delivery's stream sequence and delivery count, so that ``replay trace``
# can tell from the stored messages alone which delivery of the input was answered and how many
# earlier ones were not (nak'ed, timed out, lost with a worker).
HEADER_ANSWERS_SEQ = "Dockyard-Answers-Seq"
HEADER_ANSWERS_DELIVERY = "Dockyard-Answers-Delivery"

#: An ASCII decimal header value as ``str(n)`` writes it (docs/wire-format.md): digits 0-9 only,
#: no sign, space, exponent or other script's digits (``int`` and ``str.isdigit`` take those),
#: no leading zeros — one number has one spelling.
DECIMAL_HEADER = re.compile(r"0|[1-9][0-9]{0,31}")


def decimal_header(value: str | None) -> int | None:
    """The number an ASCII decimal header holds, None when it is absent or malformed."""
    if value is None or not DECIMAL_HEADER.fullmatch(value):
        return None
    return int(value)


# Reason codes the plane itself raises (the codec adds its own, e.g. ``schema_mismatch``).
REASON_MAX_DELIVERIES = "max_deliveries"
REASON_CHUNKS_MISSING = "chunks_missing"
#: The plane's stage name in the dead letters it raises itself (max deliveries, lost chunks,
#: malformed headers).
PLANE_STAGE = "data_plane"


@dataclass(frozen=True)
class OutgoingMessage:
    subject: str
    payload: bytes
    msg_id: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PublishAck:
    stream: str
    seq: int
    duplicate: bool


@dataclass(frozen=True)
class StoredMessage:
    """A message read back from a stream (replay, direct get, watches)."""

    stream: str
    subject: str
    seq: int
    timestamp: datetime
    headers: Mapping[str, str]
    data: bytes

    @property
    def msg_id(self) -> str | None:
        return self.headers.get(HEADER_MSG_ID)
