"""The one codec: message ⇄ (headers, one zstd frame of one msgpack map).

``encode`` never fails for a message that validated (except for sizes beyond 4 GiB);
``decode`` is defensive and bounded, and every refusal is a :class:`CodecError` with a
:class:`ReasonCode` that the broker layer turns into a dead letter. The format is specified in
``docs/wire-format.md``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar, overload

import msgspec

from dockyard.schemas.arrays import DECODING, dec_hook
from dockyard.schemas.base import Message, parse_schema_version
from dockyard.schemas.envelope import build_envelope_prefix, parse_envelope
from dockyard.schemas.errors import CodecError, ReasonCode, WireError
from dockyard.schemas.frames import ZSTD_LEVEL, compress_with_stored_tail, decompress_bounded
from dockyard.schemas.layout import lay_out, pack_meta
from dockyard.schemas.limits import DEFAULT_LIMITS, DecodeLimits
from dockyard.schemas.messages import MESSAGE_TYPES

HEADER_MSG_ID = "Nats-Msg-Id"
HEADER_SCHEMA = "Dockyard-Schema"
HEADER_SCHEMA_VERSION = "Dockyard-Schema-Version"
HEADER_CODEC = "Dockyard-Codec"
CODEC_NAME = "msgpack+zstd"

__all__ = [
    "CODEC_NAME",
    "DEFAULT_LIMITS",
    "HEADER_CODEC",
    "HEADER_MSG_ID",
    "HEADER_SCHEMA",
    "HEADER_SCHEMA_VERSION",
    "CodecError",
    "DecodeLimits",
    "EncodedMessage",
    "ReasonCode",
    "decode",
    "encode",
]

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    headers: dict[str, str] = field(repr=False)
    payload: bytes = field(repr=False)

    @property
    def message_id(self) -> str:
        return self.headers[HEADER_MSG_ID]

    def __repr__(self) -> str:
        return f"EncodedMessage({self.message_id!r}, {len(self.payload)} B)"


def encode(message: Message, *, level: int = ZSTD_LEVEL) -> EncodedMessage:
    """Headers + payload of ``message``. ``level`` (zstd) is for tuning; decoders ignore it."""
    cls = type(message)
    if MESSAGE_TYPES.get(cls.SCHEMA_NAME) is not cls:
        raise CodecError(ReasonCode.UNENCODABLE, f"{cls.__name__} is not a registered message")
    layout, laid_out = lay_out(message)
    prefix = build_envelope_prefix(
        cls.SCHEMA_NAME, cls.SCHEMA_VERSION, pack_meta(message, layout), laid_out.nbytes
    )
    payload = compress_with_stored_tail(
        b"".join((prefix, *laid_out.compressed_chunks)),
        laid_out.stored,
        laid_out.stored_nbytes,
        level,
    )
    headers = {
        HEADER_MSG_ID: message.message_id(),
        HEADER_SCHEMA: cls.SCHEMA_NAME,
        HEADER_SCHEMA_VERSION: cls.SCHEMA_VERSION,
        HEADER_CODEC: CODEC_NAME,
    }
    return EncodedMessage(headers=headers, payload=payload)


@overload
def decode(
    headers: Mapping[str, str] | None,
    payload: bytes,
    *,
    limits: DecodeLimits = ...,
    expected: type[M],
) -> M: ...


@overload
def decode(
    headers: Mapping[str, str] | None,
    payload: bytes,
    *,
    limits: DecodeLimits = ...,
    expected: None = ...,
) -> Message: ...


def decode(
    headers: Mapping[str, str] | None,
    payload: bytes,
    *,
    limits: DecodeLimits = DEFAULT_LIMITS,
    expected: type[Message] | None = None,
) -> Message:
    """The message in ``payload``; headers are optional (replay tools decode bare payloads).

    The one decode path: bounded decompression of exactly one frame, the envelope, the schema
    name and version against the headers, then msgspec decodes ``meta`` into the message's
    struct (strictly: no coercion), resolving each array descriptor in the array section."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise CodecError(ReasonCode.WRONG_TYPE, f"payload must be bytes, not {type(payload)}")
    if len(payload) > limits.max_compressed_bytes:
        raise CodecError(
            ReasonCode.PAYLOAD_TOO_LARGE,
            f"{len(payload)} bytes exceed the limit of {limits.max_compressed_bytes}",
        )
    headers = headers or {}
    codec = headers.get(HEADER_CODEC)
    if codec is not None and codec != CODEC_NAME:
        raise CodecError(ReasonCode.UNSUPPORTED_CODEC, f"codec {codec!r} is not {CODEC_NAME!r}")
    header_schema = headers.get(HEADER_SCHEMA)
    if header_schema is not None:
        # Refuse the wrong kind of message before spending a decompression on it.
        _resolve_type(header_schema, expected)

    content = decompress_bounded(bytes(payload), limits.max_decompressed_bytes)
    envelope = parse_envelope(content)
    if header_schema is not None and header_schema != envelope.schema:
        raise CodecError(
            ReasonCode.HEADER_MISMATCH,
            f"header says {header_schema!r}, payload says {envelope.schema!r}",
        )
    header_version = headers.get(HEADER_SCHEMA_VERSION)
    if header_version is not None and header_version != envelope.version:
        raise CodecError(
            ReasonCode.HEADER_MISMATCH,
            f"header says version {header_version!r}, payload says {envelope.version!r}",
        )
    cls = _resolve_type(envelope.schema, expected)
    _check_version(cls, envelope.version)
    DECODING.blob, DECODING.limits = envelope.data, limits
    try:
        return _decoder(cls).decode(envelope.meta)
    except msgspec.ValidationError as exc:  # a DecodeError too: tested first
        raise _refusal(cls, exc) from None
    except msgspec.DecodeError as exc:
        raise CodecError(ReasonCode.BAD_MSGPACK, f"{cls.SCHEMA_NAME}: {exc}") from None
    except RecursionError:
        raise CodecError(ReasonCode.BAD_MSGPACK, "msgpack nests too deep") from None
    finally:
        DECODING.blob = DECODING.limits = None


@functools.cache
def _decoder(cls: type[Message]) -> msgspec.msgpack.Decoder[Message]:
    return msgspec.msgpack.Decoder(cls, dec_hook=dec_hook)


def _resolve_type(schema: str, expected: type[Message] | None) -> type[Message]:
    cls = MESSAGE_TYPES.get(schema)
    if cls is None:
        raise CodecError(ReasonCode.UNKNOWN_SCHEMA, f"no message type named {schema[:64]!r}")
    if expected is not None and cls is not expected:
        raise CodecError(
            ReasonCode.UNEXPECTED_SCHEMA, f"expected {expected.SCHEMA_NAME!r}, got {schema!r}"
        )
    return cls


def _check_version(cls: type[Message], version: str) -> None:
    """Refuse a version of ``cls`` that this build cannot read: any MINOR of its own MAJOR
    reads (the compatibility rule), anything else is ``unsupported_version``."""
    if version == cls.SCHEMA_VERSION:  # what nearly every message carries: no parsing
        return
    try:
        major, _minor = parse_schema_version(version)
    except ValueError as exc:
        raise CodecError(ReasonCode.UNSUPPORTED_VERSION, str(exc)) from None
    if major != cls.schema_major():
        raise CodecError(
            ReasonCode.UNSUPPORTED_VERSION,
            f"{cls.SCHEMA_NAME} {version} is not readable by this build "
            f"(reads {cls.schema_major()}.x)",
        )


def _refusal(cls: type[Message], exc: msgspec.ValidationError) -> CodecError:
    """The reason of a refusal msgspec reports: a :class:`WireError` raised by a check
    (``__post_init__``, the array hook) carries its own; msgspec's own messages say a type is
    wrong ("Expected `int`, got `str`"), a field is missing, or a constraint failed. The detail
    names the field as a dotted path (``rollout.samples.worker_id.1``)."""
    cause = exc.__cause__
    text, _, where = str(exc).partition(" - at `")
    path = _PATH_INDEX.sub(r".\1", where.rstrip("`").removeprefix("$").lstrip("."))
    if isinstance(cause, WireError):
        reason, text = cause.reason, cause.detail
        if cause.field:
            path = f"{path}.{cause.field}" if path else cause.field
    elif text.startswith("Object missing required field"):
        reason = ReasonCode.MISSING_FIELD
    elif text.startswith("Expected `") and "`, got `" in text:
        reason = ReasonCode.WRONG_TYPE
    else:  # a Meta constraint, an enum or literal value not listed
        reason = ReasonCode.INVALID_FIELD
    return CodecError(reason, f"{cls.SCHEMA_NAME}: {path or '<message>'}: {text}")


_PATH_INDEX = re.compile(r"\[(\d+)\]")
