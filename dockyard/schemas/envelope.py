"""The msgpack map inside the zstd frame, laid out so arrays decode without a copy.

The frame content is *one* msgpack map, readable by any msgpack library::

    {"schema": str, "schema_version": str, "meta": map, "pad": bin, "data": bin32}

``meta`` holds the message fields, arrays as ``{dtype, shape, data: [offset, nbytes]}``
references into ``data`` (the array section). The encoder always writes ``data`` last, with a
bin32 header, after a ``pad`` of 0-7 zero bytes that puts the array section at a multiple of 8
bytes from the start of the content. The decoder reads the map with msgspec, leaving ``meta``
and ``data`` packed (views of the content, no copy): ``meta`` is then decoded into the
message's struct, and the arrays are views of ``data``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import msgspec

from dockyard.schemas.errors import CodecError, ReasonCode

KEY_SCHEMA = "schema"
KEY_VERSION = "schema_version"
KEY_META = "meta"
KEY_PAD = "pad"
KEY_DATA = "data"
_ALIGNMENT = 8
_MAX_BIN32 = (1 << 32) - 1


def _fixstr(text: str) -> bytes:
    raw = text.encode()
    return bytes([0xA0 | len(raw)]) + raw


_PAD_KEY = _fixstr(KEY_PAD)
_DATA_KEY = _fixstr(KEY_DATA)


@functools.cache
def _head_of(schema: str, version: str) -> bytes:
    """The content's first bytes, up to the meta map (one pair per message class)."""
    return b"".join(
        (
            b"\x85",  # fixmap with 5 entries
            _fixstr(KEY_SCHEMA),
            msgspec.msgpack.encode(schema),
            _fixstr(KEY_VERSION),
            msgspec.msgpack.encode(version),
            _fixstr(KEY_META),
        )
    )


def build_envelope_prefix(schema: str, version: str, meta: bytes, data_nbytes: int) -> bytes:
    """Everything of the content before the array section's bytes (``meta``: the packed map)."""
    if data_nbytes > _MAX_BIN32:
        raise CodecError(ReasonCode.UNENCODABLE, f"array section of {data_nbytes} B exceeds 4 GiB")
    head = _head_of(schema, version)
    # pad entry = key + bin8 header (2 B) + k zero bytes; data entry = key + bin32 header (5 B).
    fixed = len(head) + len(meta) + len(_PAD_KEY) + 2 + len(_DATA_KEY) + 5
    padding = -fixed % _ALIGNMENT
    return b"".join(
        (
            head,
            meta,
            _PAD_KEY,
            bytes((0xC4, padding)),
            bytes(padding),
            _DATA_KEY,
            b"\xc6",
            data_nbytes.to_bytes(4, "big"),
        )
    )


@dataclass(frozen=True, slots=True)
class Envelope:
    schema: str
    version: str
    #: The packed meta map (a view of the content).
    meta: memoryview
    #: The array section (a view of the content).
    data: memoryview


_ABSENT = msgspec.Raw()


class _EnvelopeEntries(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The top-level map's entries, in any order, ``meta``, ``pad`` and ``data`` left packed
    (a ``Raw`` is a view of the content: msgspec steps over them without copying)."""

    schema: str
    schema_version: str
    meta: msgspec.Raw
    pad: msgspec.Raw = _ABSENT
    data: msgspec.Raw = _ABSENT


_ENVELOPE_ENTRIES = msgspec.msgpack.Decoder(_EnvelopeEntries)
#: The first byte of a msgpack map (fixmap, map16, map32) and of a bin (bin8/16/32) with the
#: width of its length.
_MAP_HEADERS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))
_BIN_HEADERS = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _map_size(content: bytes) -> int:
    first = content[0]
    if first == 0xDE:
        return int.from_bytes(content[1:3], "big")
    if first == 0xDF:
        return int.from_bytes(content[1:5], "big")
    return first & 0x0F


def parse_envelope(content: bytes) -> Envelope:
    """The envelope of ``content``, every rule of the wire-format doc checked: exactly one map
    and nothing after it (``bad_msgpack``), of the five keys, each at most once, the first three
    required (``bad_envelope``), ``meta`` a map, ``pad`` and ``data`` bins."""
    try:
        entries = _ENVELOPE_ENTRIES.decode(content)
    except msgspec.ValidationError as exc:  # a DecodeError too: tested first
        # The msgpack before the envelope: msgspec checks the entries as it meets them, so a
        # map that would fail both (a missing key, then trailing bytes) says which here.
        _one_msgpack_value(content)
        raise CodecError(ReasonCode.BAD_ENVELOPE, f"envelope: {exc}") from None
    except msgspec.DecodeError as exc:
        raise CodecError(ReasonCode.BAD_MSGPACK, f"msgpack: {exc}") from None
    except RecursionError:
        raise CodecError(ReasonCode.BAD_MSGPACK, "msgpack nests too deep") from None
    pad, data = entries.pad, entries.data
    present = 3 + (pad is not _ABSENT) + (data is not _ABSENT)
    if _map_size(content) != present:  # msgspec keeps a repeated key's last value
        raise CodecError(ReasonCode.BAD_ENVELOPE, "a top-level key appears twice")
    meta = memoryview(entries.meta)
    if meta[0] not in _MAP_HEADERS:
        raise CodecError(ReasonCode.BAD_ENVELOPE, "meta must be a map")
    if pad is not _ABSENT and _bin_body(memoryview(pad)) is None:
        raise CodecError(ReasonCode.BAD_ENVELOPE, "pad must be bin")
    body: memoryview | None
    if data is _ABSENT:
        body = memoryview(b"")
    else:
        body = _bin_body(memoryview(data))
        if body is None:
            raise CodecError(ReasonCode.BAD_ENVELOPE, "data must be bin")
    return Envelope(schema=entries.schema, version=entries.schema_version, meta=meta, data=body)


_ONE_VALUE = msgspec.msgpack.Decoder(msgspec.Raw)


def _one_msgpack_value(content: bytes) -> None:
    """``bad_msgpack`` unless ``content`` is exactly one well-formed msgpack value."""
    try:
        _ONE_VALUE.decode(content)
    except msgspec.DecodeError as exc:
        raise CodecError(ReasonCode.BAD_MSGPACK, f"msgpack: {exc}") from None
    except RecursionError:
        raise CodecError(ReasonCode.BAD_MSGPACK, "msgpack nests too deep") from None


def _bin_body(value: memoryview) -> memoryview | None:
    """The bytes of one packed msgpack value if it is a bin, else None."""
    width = _BIN_HEADERS.get(value[0])
    return None if width is None else value[1 + width :]
