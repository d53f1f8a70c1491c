"""Typed refusals of the codec: a reason code the broker layer turns into a dead letter.

Every way a payload can be refused maps to exactly one :class:`ReasonCode`; the ``detail`` is a
human-readable sentence (field path, sizes, limits) meant for the dead letter's message.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    # Size limits, checked before anything is allocated.
    PAYLOAD_TOO_LARGE = "payload_too_large"
    DECOMPRESSED_TOO_LARGE = "decompressed_too_large"
    # Framing: zstd and msgpack.
    CORRUPT_FRAME = "corrupt_frame"
    BAD_MSGPACK = "bad_msgpack"
    BAD_ENVELOPE = "bad_envelope"
    # Headers and schema identity.
    UNSUPPORTED_CODEC = "unsupported_codec"
    HEADER_MISMATCH = "header_mismatch"
    UNKNOWN_SCHEMA = "unknown_schema"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNEXPECTED_SCHEMA = "unexpected_schema"
    #: A header the transport reads is malformed (e.g. a chunk count that is not a number):
    #: refused by the broker layer before anything is decoded.
    BAD_HEADER = "bad_header"
    # Field validation.
    WRONG_TYPE = "wrong_type"
    MISSING_FIELD = "missing_field"
    INVALID_FIELD = "invalid_field"
    # Arrays.
    BAD_ARRAY = "bad_array"
    ARRAY_TOO_LARGE = "array_too_large"
    LENGTH_MISMATCH = "length_mismatch"
    NON_FINITE = "non_finite"
    TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
    # Encoding side (a message that cannot be put on the wire).
    UNENCODABLE = "unencodable"


class WireError(ValueError):
    """A value a message cannot hold, raised where the message is built: by its
    ``__post_init__`` (in Python and on decode) or by the array hook on decode. msgspec wraps
    it in a ``ValidationError`` (with the field path) whose ``__cause__`` is this error; the codec
    turns it into a :class:`CodecError` of the same reason."""

    def __init__(self, reason: ReasonCode, detail: str, field: str | None = None) -> None:
        super().__init__(f"{reason.value}: {field + ': ' if field else ''}{detail}")
        self.reason = reason
        self.detail = detail
        #: The field refused, below the struct msgspec's path names (a column, an array).
        self.field = field

    def __reduce__(self) -> tuple[type[WireError], tuple[ReasonCode, str, str | None]]:
        return (type(self), (self.reason, self.detail, self.field))


class CodecError(Exception):
    """A message refused by :func:`dockyard.schemas.codec.decode` (or ``encode``)."""

    def __init__(self, reason: ReasonCode, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[CodecError], tuple[ReasonCode, str]]:
        # Exceptions with custom __init__ signatures need this to survive pickling
        # (multiprocessing workers report refusals across process boundaries).
        return (type(self), (self.reason, self.detail))
