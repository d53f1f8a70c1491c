"""A corpus of malformed headers, each with the dead letter's reason docs/wire-format.md gives it
("Malformed headers"), and how to put one on a subject beside a well-formed message.

Every header the plane or the codec reads is here: the four chunk-reference headers
(``Dockyard-Chunks``, ``-Chunk-Ref``, ``-Payload-Size``, ``-Payload-Sha256``) and the codec's
three (``Dockyard-Schema``, ``-Schema-Version``, ``-Codec``). A poison keeps the well-formed
message's body unless it is a reference (whose body is empty on the wire), so only its headers
make it poison: a reader that ignored them would take it for the good message.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from dockyard.broker.chunking import chunk_ref
from dockyard.broker.plane import (
    HEADER_CHUNK_REF,
    HEADER_CHUNKS,
    HEADER_PAYLOAD_SHA256,
    HEADER_PAYLOAD_SIZE,
    DataPlane,
    PublishAck,
)
from dockyard.schemas import HEADER_CODEC, HEADER_SCHEMA, HEADER_SCHEMA_VERSION, encode
from dockyard.schemas.base import Message

BAD_HEADER = "bad_header"
CHUNKS_MISSING = "chunks_missing"
PAYLOAD_TOO_LARGE = "payload_too_large"

#: Stands for the message's own ref (the first half of the SHA-256 of its ``Nats-Msg-Id``, as
#: docs/wire-format.md defines it), which ``publish_poison`` writes in.
OWN_REF = "<the message's own ref>"
#: What ``publish_poison`` stores as the one chunk under a poison's own ref when it asks for it.
STORED_CHUNK = b"ten bytes!"
#: Stands for the name of another message type than the one the subject carries.
OTHER_SCHEMA = "<another type>"


def reference(
    *,
    count: str = "1",
    ref: str = OWN_REF,
    size: str = "10",
    sha256: str = "0" * 64,
) -> dict[str, str]:
    return {
        HEADER_CHUNKS: count,
        HEADER_CHUNK_REF: ref,
        HEADER_PAYLOAD_SIZE: size,
        HEADER_PAYLOAD_SHA256: sha256,
    }


@dataclass(frozen=True)
class Poison:
    name: str
    headers: dict[str, str] = field(default_factory=dict)
    reason: str = BAD_HEADER
    #: A reference message (empty body, as chunking publishes it) rather than the good body.
    empty_body: bool = False
    #: :data:`STORED_CHUNK` is in the chunk stream under the poison's own ref.
    stored_chunk: bool = False
    #: The reason a history reader gives, where it differs (it expects no particular type).
    history_reason: str | None = None

    def reason_in_history(self) -> str:
        return self.history_reason or self.reason


CORPUS: tuple[Poison, ...] = (
    # The message: one non-numeric chunk count, nothing else.
    Poison("chunks alone, not a number", {HEADER_CHUNKS: "two"}),
    Poison("chunk count not a number", reference(count="two")),
    Poison("chunk count negative", reference(count="-1")),
    Poison("chunk count zero", reference(count="0")),
    Poison("chunk count signed", reference(count="+1")),
    Poison("chunk count empty", reference(count="")),
    Poison("chunk count in another script's digits", reference(count="\u0661")),
    Poison("chunk count huge", reference(count="9" * 30)),
    Poison("more chunks than bytes", reference(count="11")),
    Poison("chunk ref a wildcard", reference(ref=">")),
    Poison("chunk ref with a subject separator", reference(ref="a.b")),
    Poison("chunk ref too short", reference(ref="abc")),
    Poison("size not a number", reference(size="1e3")),
    Poison("size empty", reference(size="")),
    Poison("size beyond any decoder's limit", reference(size=str(10**12)), PAYLOAD_TOO_LARGE),
    Poison("digest not hex", reference(sha256="z" * 64)),
    Poison("digest too short", reference(sha256="ab")),
    Poison("digest upper case", reference(sha256="A" * 64)),
    Poison("reference without its digest", {HEADER_CHUNKS: "1", HEADER_CHUNK_REF: OWN_REF}),
    Poison("reference without a count", {HEADER_CHUNK_REF: OWN_REF}),
    # Well formed but not this message's: it would read another message's chunks as its own.
    Poison("chunk ref not the message id's", reference(ref="b" * 32), empty_body=True),
    Poison("chunks that were never stored", reference(), CHUNKS_MISSING, empty_body=True),
    Poison(
        "chunks that do not match the digest",
        reference(),
        CHUNKS_MISSING,
        empty_body=True,
        stored_chunk=True,
    ),
    Poison(
        "chunks longer than the declared size",
        reference(size="4", sha256=hashlib.sha256(b"ten ").hexdigest()),
        CHUNKS_MISSING,
        empty_body=True,
        stored_chunk=True,
    ),
    Poison("schema unknown", {HEADER_SCHEMA: "nonsense"}, "unknown_schema"),
    Poison("schema empty", {HEADER_SCHEMA: ""}, "unknown_schema"),
    Poison(
        "schema of another type",
        {HEADER_SCHEMA: OTHER_SCHEMA},
        "unexpected_schema",
        history_reason="header_mismatch",
    ),
    Poison("schema version not the payload's", {HEADER_SCHEMA_VERSION: "9.0"}, "header_mismatch"),
    Poison("schema version not a version", {HEADER_SCHEMA_VERSION: "x"}, "header_mismatch"),
    Poison("codec unknown", {HEADER_CODEC: "gzip"}, "unsupported_codec"),
    Poison("codec empty", {HEADER_CODEC: ""}, "unsupported_codec"),
)


async def publish_poison(
    plane: DataPlane, subject: str, good: Message, poison: Poison, msg_id: str
) -> PublishAck:
    """``good`` on ``subject`` with ``poison``'s headers over its own."""
    encoded = encode(good)
    headers = {k: v for k, v in encoded.headers.items() if k != "Nats-Msg-Id"}
    headers.update(poison.headers)
    own_ref = chunk_ref(msg_id)
    if headers.get(HEADER_CHUNK_REF) == OWN_REF:
        headers[HEADER_CHUNK_REF] = own_ref
    if poison.stored_chunk:
        # As a chunked publish stores it: the chunk first, then its reference.
        chunk_subject = plane.names.chunk_subject(own_ref, 0)
        await plane.publish(chunk_subject, STORED_CHUNK, msg_id=f"{msg_id}#chunk0")
    if headers.get(HEADER_SCHEMA) == OTHER_SCHEMA:
        own = type(good).SCHEMA_NAME
        headers[HEADER_SCHEMA] = "prompt_group" if own != "prompt_group" else "rollout"
    body = b"" if poison.empty_body else encoded.payload
    return await plane.publish(subject, body, msg_id=msg_id, headers=headers)
