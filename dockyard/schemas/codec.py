"""The one codec: message ⇄ (headers, one zstd frame of one msgpack map).

``encode`` never fails for a message that validated (except for sizes beyond 4 GiB);
``decode`` is defensive and bounded, and every refusal is a :class:`CodecError` with a
:class:`ReasonCode` that the broker layer turns into a dead letter. The format is specified in
``docs/wire-format.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from pydantic import ValidationError

from dockyard.schemas.arrays import CTX_BLOB, CTX_LIMITS, CTX_PRECHECKED
from dockyard.schemas.base import Message, parse_schema_version
from dockyard.schemas.compiled import read_compiled
from dockyard.schemas.envelope import (
    build_envelope_prefix,
    parse_envelope,
    scan_envelope,
)
from dockyard.schemas.errors import CodecError, ReasonCode
from dockyard.schemas.frames import ZSTD_LEVEL, compress_with_stored_tail, decompress_bounded
from dockyard.schemas.layout import lay_out
from dockyard.schemas.limits import DEFAULT_LIMITS, DecodeLimits
from dockyard.schemas.messages import MESSAGE_TYPES
from dockyard.schemas.precheck import ArrayPrecheck, NotChecked
from dockyard.schemas.prechecked import prechecked_validator

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
    laid_out = lay_out(message)
    prefix = build_envelope_prefix(
        cls.SCHEMA_NAME, cls.SCHEMA_VERSION, laid_out.meta, laid_out.nbytes
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
    compiled: bool = ...,
    expected: type[M],
) -> M: ...


@overload
def decode(
    headers: Mapping[str, str] | None,
    payload: bytes,
    *,
    limits: DecodeLimits = ...,
    compiled: bool = ...,
    expected: None = ...,
) -> Message: ...


def decode(
    headers: Mapping[str, str] | None,
    payload: bytes,
    *,
    limits: DecodeLimits = DEFAULT_LIMITS,
    compiled: bool = True,
    expected: type[Message] | None = None,
) -> Message:
    """The message in ``payload``; headers are optional (replay tools decode bare payloads).

    ``compiled=False`` skips the compiled reader (``compiled``) and decodes the reference way
    only: the same result, for benchmarks and for checking a suspected difference."""
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
    if compiled:
        message = _decode_compiled(content, headers, limits, expected)
        if message is not None:
            return message
    envelope = parse_envelope(content, limits)
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
    return _validate(cls, envelope.meta, envelope.data, limits)


def _decode_compiled(
    content: bytes,
    headers: Mapping[str, str],
    limits: DecodeLimits,
    expected: type[Message] | None,
) -> Message | None:
    """The message read by the compiled reader (``compiled``), or None for the reference path:
    a message of the current major whose envelope and headers are in order, nothing else."""
    envelope = scan_envelope(content, limits)
    if envelope is None:
        return None
    schema, version = envelope.schema, envelope.version
    cls = MESSAGE_TYPES.get(schema)
    if (
        cls is None
        or (expected is not None and cls is not expected)
        or headers.get(HEADER_SCHEMA, schema) != schema
        or headers.get(HEADER_SCHEMA_VERSION, version) != version
    ):
        return None
    try:
        _check_version(cls, version)
    except CodecError:
        return None
    return read_compiled(cls, envelope.meta, envelope.data, limits)  # type: ignore[no-any-return]


def _validate(
    cls: type[Message], meta: dict[str, Any], blob: memoryview | bytes, limits: DecodeLimits
) -> Message:
    # Fast path: every array resolved and checked once per message, then pydantic validates
    # the rest. When the pre-pass is unsure, the reference path validates array by array.
    precheck = ArrayPrecheck(blob, limits)
    try:
        precheck.run(cls, meta)
    except NotChecked:
        precheck.restore()
        prechecked = False
    else:
        prechecked = True
    context: dict[str, Any] = {CTX_BLOB: blob, CTX_LIMITS: limits}
    try:
        if prechecked:  # the arrays need no Python call each (``prechecked``)
            context[CTX_PRECHECKED] = True
            return prechecked_validator(cls).validate_python(meta, strict=True, context=context)
        return cls.model_validate(meta, strict=True, context=context)
    except ValidationError as exc:
        raise _refusal(cls, exc) from None


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


_REASONS_BY_VALUE = {reason.value: reason for reason in ReasonCode}


def _reason_of(error_type: str) -> ReasonCode:
    if error_type in _REASONS_BY_VALUE:
        return _REASONS_BY_VALUE[error_type]
    if error_type == "missing":
        return ReasonCode.MISSING_FIELD
    if error_type == "finite_number":  # a float field that refuses NaN and infinities
        return ReasonCode.NON_FINITE
    if error_type.endswith(("_type", "_parsing")) or error_type in {
        "is_instance_of",
        "model_attributes_type",
        "invalid-json-value",  # a msgpack value JSON has no type for (bin, in ``extra``)
    }:
        return ReasonCode.WRONG_TYPE
    return ReasonCode.INVALID_FIELD


def _refusal(cls: type[Message], exc: ValidationError) -> CodecError:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    described = [
        f"{'.'.join(str(part) for part in error['loc']) or '<message>'}: {error['msg']}"
        for error in errors[:3]
    ]
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return CodecError(_reason_of(first["type"]), f"{cls.SCHEMA_NAME}: {'; '.join(described)}{more}")
