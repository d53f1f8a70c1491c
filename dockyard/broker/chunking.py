"""Oversized messages travel by reference: chunks in a side stream, one small reference message.

A payload larger than the usable message size is split into chunks published to
``<ns>.chunks.<ref>.<index>`` (stream ``<ns>_chunks``, LIMITS retention), then one *reference*
message with an empty body goes to the original subject carrying the original headers plus
``Dockyard-Chunks`` (count), ``Dockyard-Chunk-Ref``, ``Dockyard-Payload-Size`` and
``Dockyard-Payload-Sha256``. Only the reference is consumed, acked and deduplicated, so the
message is delivered (and reassembled) exactly as often as a small one would be; the chunks are
read with direct gets by subject and verified by size and SHA-256. Chunks are published before
the reference, so a reference never points at chunks that were not stored.

:func:`read` is where every plane turns a message's headers into its payload, for consumers and
history readers alike. Those headers are input like the payload (anyone may publish anything):
each one is checked before it is used, and a malformed one is a :class:`PayloadError` with the
reason code its dead letter gets, never another exception.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from dockyard.broker.messages import DECIMAL_HEADER, HEADER_MSG_ID
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import (
    HEADER_CHUNK_REF,
    HEADER_CHUNKS,
    HEADER_PAYLOAD_SHA256,
    HEADER_PAYLOAD_SIZE,
    HEADER_UNREADABLE,
    REASON_CHUNKS_MISSING,
    OutgoingMessage,
    PayloadError,
)
from dockyard.schemas import DEFAULT_LIMITS, ReasonCode
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

# Room left under the server's max_payload for headers and protocol framing.
HEADER_ROOM = 16 * 1024
#: The four headers of a reference message: one of them makes a message a reference.
CHUNK_HEADERS = (HEADER_CHUNKS, HEADER_CHUNK_REF, HEADER_PAYLOAD_SIZE, HEADER_PAYLOAD_SHA256)
#: The largest payload a reference may declare: the largest frame a decoder accepts
#: (``DecodeLimits.max_compressed_bytes``); reassembling more would only be refused afterwards.
MAX_REASSEMBLED_BYTES = DEFAULT_LIMITS.max_compressed_bytes
#: Chunks read at once. A reference may declare any count: read in windows that stop at the
#: first missing chunk or byte too many, it costs a reader at most its declared size plus a
#: window of chunks, and only as many reads as there are chunks to find.
READ_WINDOW = 8
_REF = re.compile(r"[0-9a-f]{32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

#: Reads chunk ``index`` of reference ``ref``: its bytes, or None when it is not stored.
ChunkReader = Callable[[str, int], Awaitable[bytes | None]]


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


def _bad_header(detail: str) -> PayloadError:
    return PayloadError(detail, reason=ReasonCode.BAD_HEADER.value)


def _matching(headers: Mapping[str, str], name: str, pattern: re.Pattern[str], what: str) -> str:
    value = headers[name]
    if not pattern.fullmatch(value):
        # The value is cut: a poison header may be as long as a message.
        raise _bad_header(f"{name} {value[:80]!r} is not {what}")
    return value


def reference_of(headers: Mapping[str, str]) -> ChunkReference | None:
    """The chunk reference ``headers`` carry, None for an ordinary message; a
    :class:`PayloadError` when they are not exactly what :func:`split` writes."""
    if not any(name in headers for name in CHUNK_HEADERS):
        return None
    missing = [name for name in CHUNK_HEADERS if name not in headers]
    if missing:
        raise _bad_header(f"a chunk reference without {', '.join(missing)}")
    # ASCII decimal without leading zeros: ``int`` would also take " 3", "+3", "3_000", "03"
    # and other scripts' digits.
    count = int(_matching(headers, HEADER_CHUNKS, DECIMAL_HEADER, "a decimal chunk count"))
    size = int(_matching(headers, HEADER_PAYLOAD_SIZE, DECIMAL_HEADER, "a decimal size in bytes"))
    ref = _matching(headers, HEADER_CHUNK_REF, _REF, "32 lowercase hex digits")
    msg_id = headers.get(HEADER_MSG_ID, "")
    if ref != chunk_ref(msg_id):
        # The ref names the chunks: one that is not its message's own would read another
        # message's payload (or a forged one) as this message's.
        raise _bad_header(
            f"{HEADER_CHUNK_REF} {ref} is not the first half of the SHA-256 of "
            f"{HEADER_MSG_ID} {msg_id[:80]!r}"
        )
    reference = ChunkReference(
        ref=ref,
        count=count,
        size=size,
        sha256=_matching(headers, HEADER_PAYLOAD_SHA256, _SHA256, "64 lowercase hex digits"),
    )
    if size > MAX_REASSEMBLED_BYTES:
        raise PayloadError(
            f"chunked payload {reference.ref}: {size} bytes exceed the limit of "
            f"{MAX_REASSEMBLED_BYTES}",
            reason=ReasonCode.PAYLOAD_TOO_LARGE.value,
        )
    if not 1 <= count <= size:
        # Every chunk holds at least one byte, and a reference has at least one chunk.
        raise _bad_header(f"{HEADER_CHUNKS} {count} for {size} bytes (must be 1..{size})")
    return reference


def join(reference: ChunkReference, parts: list[bytes]) -> bytes:
    payload = b"".join(parts)
    if len(payload) != reference.size:
        raise PayloadError(
            f"chunked payload {reference.ref}: {len(payload)} bytes, expected {reference.size}",
            reason=REASON_CHUNKS_MISSING,
        )
    if hashlib.sha256(payload).hexdigest() != reference.sha256:
        raise PayloadError(
            f"chunked payload {reference.ref}: SHA-256 mismatch", reason=REASON_CHUNKS_MISSING
        )
    return payload


def strip_chunk_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in headers.items() if key not in CHUNK_HEADERS}


async def _reassemble(reference: ChunkReference, read_chunk: ChunkReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    for start in range(0, reference.count, READ_WINDOW):
        indices = range(start, min(start + READ_WINDOW, reference.count))
        window = await asyncio.gather(*(read_chunk(reference.ref, i) for i in indices))
        for index, part in zip(indices, window, strict=True):
            if part is None:
                raise PayloadError(
                    f"chunk {index} of {reference.ref} is gone", reason=REASON_CHUNKS_MISSING
                )
            total += len(part)
            if total > reference.size:
                raise PayloadError(
                    f"chunked payload {reference.ref}: more than {reference.size} bytes in "
                    f"chunks 0..{index}",
                    reason=REASON_CHUNKS_MISSING,
                )
            parts.append(part)
    return join(reference, parts)


def _without_marker(headers: Mapping[str, str]) -> Mapping[str, str]:
    """Only a reader sets :data:`HEADER_UNREADABLE`, about what it read: one that came with the
    message is noise (a dead letter's original headers sent back by ``replay requeue``, or a
    forgery)."""
    if HEADER_UNREADABLE not in headers:
        return headers
    return {key: value for key, value in headers.items() if key != HEADER_UNREADABLE}


async def read(
    headers: Mapping[str, str], data: bytes, read_chunk: ChunkReader
) -> tuple[Mapping[str, str], bytes]:
    """The headers and payload of a message as it was published: a reference's chunks read
    (``read_chunk``) and checked, its chunk headers gone. A :class:`PayloadError` (with the
    dead letter's reason) when its headers are malformed or its chunks gone."""
    headers = _without_marker(headers)
    reference = reference_of(headers)
    if reference is None:
        return headers, data
    if data:
        # split() writes references with an empty body: bytes here are neither the payload
        # (that is in the chunks) nor anything a reader should guess at.
        raise _bad_header(f"a chunk reference with a body of {len(data)} bytes (it has none)")
    return strip_chunk_headers(headers), await _reassemble(reference, read_chunk)


async def read_stored(
    headers: Mapping[str, str], data: bytes, read_chunk: ChunkReader, *, seq: int
) -> tuple[Mapping[str, str], bytes]:
    """:func:`read` for history readers (replay, the trainer's resume, watches), which never
    refuse: a message it cannot read comes back with an empty body, which no reader decodes,
    and :data:`HEADER_UNREADABLE` saying why (its dead letter was raised when it was consumed)."""
    try:
        return await read(headers, data, read_chunk)
    except PayloadError as error:
        log.warning("history.unreadable", seq=seq, reason=error.reason, error=str(error))
        return {**_without_marker(headers), HEADER_UNREADABLE: f"{error.reason}: {error}"}, b""
