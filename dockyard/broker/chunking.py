"""Oversized messages travel by reference: chunks in a side stream, one small reference message.

A payload larger than the usable message size is split into chunks published to
``<ns>.chunks.<ref>.<index>`` (stream ``<ns>_chunks``, LIMITS retention), then one *reference*
message with an empty body goes to the original subject carrying the original headers plus
``Dockyard-Chunks`` (count), ``Dockyard-Chunk-Ref``, ``Dockyard-Payload-Size`` and
``Dockyard-Payload-Sha256``. Only the reference is consumed, acked and deduplicated, so the
message is delivered (and reassembled) exactly as often as a small one would be; the chunks are
read with direct gets by subject and verified by size and SHA-256. Chunks are published before
the reference, so a reference never points at chunks that were not stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import (
    HEADER_CHUNK_REF,
    HEADER_CHUNKS,
    HEADER_PAYLOAD_SHA256,
    HEADER_PAYLOAD_SIZE,
    OutgoingMessage,
    PayloadError,
)

# Room left under the server's max_payload for headers and protocol framing.
HEADER_ROOM = 16 * 1024


@dataclass(frozen=True)
class ChunkedMessage:
    chunks: tuple[OutgoingMessage, ...]
    reference: OutgoingMessage


@dataclass(frozen=True)
class ChunkReference:
    ref: str
    count: int
    size: int
    sha256: str


def chunk_ref(msg_id: str) -> str:
    """A subject-safe token, deterministic in the message id so a retried publish dedupes."""
    return hashlib.sha256(msg_id.encode()).hexdigest()[:32]


def split(
    names: PlaneNames,
    subject: str,
    payload: bytes,
    *,
    msg_id: str,
    headers: Mapping[str, str],
    chunk_size: int,
) -> ChunkedMessage:
    ref = chunk_ref(msg_id)
    view = memoryview(payload)
    chunks = tuple(
        OutgoingMessage(
            subject=names.chunk_subject(ref, index),
            payload=bytes(view[offset : offset + chunk_size]),
            msg_id=f"{msg_id}#chunk{index}",
        )
        for index, offset in enumerate(range(0, len(payload), chunk_size))
    )
    reference_headers = dict(headers)
    reference_headers.update(
        {
            HEADER_CHUNKS: str(len(chunks)),
            HEADER_CHUNK_REF: ref,
            HEADER_PAYLOAD_SIZE: str(len(payload)),
            HEADER_PAYLOAD_SHA256: hashlib.sha256(payload).hexdigest(),
        }
    )
    reference = OutgoingMessage(subject, b"", msg_id, reference_headers)
    return ChunkedMessage(chunks, reference)


def reference_of(headers: Mapping[str, str]) -> ChunkReference | None:
    if HEADER_CHUNKS not in headers:
        return None
    try:
        return ChunkReference(
            ref=headers[HEADER_CHUNK_REF],
            count=int(headers[HEADER_CHUNKS]),
            size=int(headers[HEADER_PAYLOAD_SIZE]),
            sha256=headers[HEADER_PAYLOAD_SHA256],
        )
    except (KeyError, ValueError) as error:
        raise PayloadError(f"malformed chunk reference headers: {error}") from error


def join(reference: ChunkReference, parts: list[bytes]) -> bytes:
    payload = b"".join(parts)
    if len(payload) != reference.size:
        raise PayloadError(
            f"chunked payload {reference.ref}: {len(payload)} bytes, expected {reference.size}"
        )
    if hashlib.sha256(payload).hexdigest() != reference.sha256:
        raise PayloadError(f"chunked payload {reference.ref}: SHA-256 mismatch")
    return payload


def strip_chunk_headers(headers: Mapping[str, str]) -> dict[str, str]:
    hidden = {HEADER_CHUNKS, HEADER_CHUNK_REF, HEADER_PAYLOAD_SIZE, HEADER_PAYLOAD_SHA256}
    return {key: value for key, value in headers.items() if key not in hidden}
