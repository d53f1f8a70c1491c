"""The msgpack map inside the zstd frame, laid out so arrays decode without a copy.

The frame content is *one* msgpack map, readable by any msgpack library::

    {"schema": str, "schema_version": str, "meta": map, "pad": bin, "data": bin32}

``meta`` holds the message fields, arrays as ``{dtype, shape, data: [offset, nbytes]}``
references into ``data`` (the array section). The encoder always writes ``data`` last, with a
bin32 header, after a ``pad`` of 0-7 zero bytes that puts the array section at a multiple of 8
bytes from the start of the content. The decoder streams the map's entries with msgpack; when
it reaches the last key ``data`` it does not let msgpack copy the bytes but takes a
``memoryview`` of the decompressed buffer instead. Any other (valid) key order still decodes,
with one copy of the array section.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import msgpack
import msgspec

from dockyard.schemas.errors import CodecError, ReasonCode
from dockyard.schemas.layout import pack_plain_model
from dockyard.schemas.limits import DecodeLimits

KEY_SCHEMA = "schema"
KEY_VERSION = "schema_version"
KEY_META = "meta"
KEY_PAD = "pad"
KEY_DATA = "data"
_ENVELOPE_KEYS = frozenset({KEY_SCHEMA, KEY_VERSION, KEY_META, KEY_PAD, KEY_DATA})
_ALIGNMENT = 8
_MAX_BIN32 = (1 << 32) - 1
#: How much of the frame msgpack buffers at a time; the array section is never read through it.
_READ_SIZE = 64 * 1024


def _fixstr(text: str) -> bytes:
    raw = text.encode()
    return bytes([0xA0 | len(raw)]) + raw


#: How metadata is unpacked besides the size limits: text as str, only str (or bin) map keys
#: (a bin key is then refused by the strict field types), no ext types. The compiled reader
#: unpacks what it leaves to pydantic the same way. A key repeated inside ``meta`` keeps its
#: last value, as msgspec (the compiled reader) does: refusing it would take a second pass
#: over the metadata with a Python call per map, ≈ 40 µs of a 64 KiB group's ≈ 75 µs decode
#: (docs/wire-format.md states the rule).
UNPACKING: dict[str, Any] = {"raw": False, "strict_map_key": True, "max_ext_len": 0}

_PAD_KEY = _fixstr(KEY_PAD)
_DATA_KEY = _fixstr(KEY_DATA)


#: The meta map's packer: msgspec writes the same msgpack as ``msgpack.packb`` (smallest int
#: and str forms, float64, bin for bytes, enums as their values) at about twice the speed.
#: Encoders hold no state between calls (and the GIL during one): one serves every thread.
_META_ENCODER = msgspec.msgpack.Encoder(enc_hook=pack_plain_model)


@functools.cache
def _head_of(schema: str, version: str) -> bytes:
    """The content's first bytes, up to the meta map (one pair per message class)."""
    return b"".join(
        (
            b"\x85",  # fixmap with 5 entries
            _fixstr(KEY_SCHEMA),
            msgpack.packb(schema),
            _fixstr(KEY_VERSION),
            msgpack.packb(version),
            _fixstr(KEY_META),
        )
    )


def build_envelope_prefix(
    schema: str, version: str, meta: dict[str, Any], data_nbytes: int
) -> bytes:
    """Everything of the content before the array section's bytes."""
    if data_nbytes > _MAX_BIN32:
        raise CodecError(ReasonCode.UNENCODABLE, f"array section of {data_nbytes} B exceeds 4 GiB")
    try:
        head = _head_of(schema, version) + _META_ENCODER.encode(meta)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(ReasonCode.UNENCODABLE, f"msgpack cannot encode: {exc}") from exc
    # pad entry = key + bin8 header (2 B) + k zero bytes; data entry = key + bin32 header (5 B).
    fixed = len(head) + len(_PAD_KEY) + 2 + len(_DATA_KEY) + 5
    padding = -fixed % _ALIGNMENT
    return b"".join(
        (
            head,
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
    meta: dict[str, Any]
    data: memoryview | bytes


class _ChunkReader:
    """A file-like over the content for msgpack: copies only the chunks msgpack asks for."""

    __slots__ = ("_position", "_view")

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._position = 0

    def read(self, size: int) -> bytes:
        chunk = bytes(self._view[self._position : self._position + size])
        self._position += len(chunk)
        return chunk


_BIN_HEADERS = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _bin_in_place(view: memoryview, position: int) -> memoryview | None:
    """The bin value at ``position`` as a view when it ends the content exactly; else None."""
    if position >= len(view):
        return None
    width = _BIN_HEADERS.get(view[position])
    if width is None:
        return None
    start = position + 1 + width
    length = int.from_bytes(view[position + 1 : start], "big")
    if start + length != len(view):
        return None
    return view[start:]


def parse_envelope(content: bytes, limits: DecodeLimits) -> Envelope:
    view = memoryview(content)
    entries, unpacker, ended_in_place = _read_entries(view, limits)
    if not ended_in_place and unpacker.tell() != len(view):
        raise CodecError(
            ReasonCode.BAD_MSGPACK, f"{len(view) - unpacker.tell()} bytes after the top-level map"
        )
    return _checked(entries)


@dataclass(frozen=True, slots=True)
class PackedEnvelope:
    """An envelope whose ``meta`` map is still packed: the bytes of its msgpack map."""

    schema: str
    version: str
    meta: memoryview
    data: memoryview | bytes


class _EnvelopeEntries(msgspec.Struct, forbid_unknown_fields=True):
    """The top-level map's five entries (in any order), every value but the two strings left
    packed: msgspec steps over ``meta`` and ``data`` without copying (a ``Raw`` is a view of
    the content)."""

    schema: str
    schema_version: str
    meta: msgspec.Raw
    pad: msgspec.Raw
    data: msgspec.Raw


_ENVELOPE_ENTRIES = msgspec.msgpack.Decoder(_EnvelopeEntries)
_FIXMAP_5 = 0x85


def scan_envelope(content: bytes, limits: DecodeLimits) -> PackedEnvelope | None:
    """The envelope with ``meta`` left packed, for the compiled reader (``compiled``); None
    when anything about it is unusual: :func:`parse_envelope` then says what.

    One msgspec pass over the content checks that it is exactly one map of the five envelope
    entries, each once (a fixmap of five entries and five required, distinct fields: no room
    for a repeated or unknown key), and nothing after it; the values are then checked the way
    :func:`parse_envelope` would unpack them. The meta map is stepped over, not unpacked; it
    must be at most as many bytes as the smallest msgpack limit, so that no string, bin or
    container inside it can exceed a limit that :func:`parse_envelope` would have enforced.
    The array section must fit ``max_bin_bytes`` (the reference lets a section that ends the
    content exceed it: such messages are read the reference way).
    """
    if not content or content[0] != _FIXMAP_5:
        return None
    try:
        envelope = _ENVELOPE_ENTRIES.decode(content)
    except msgspec.DecodeError:
        return None
    schema, version = envelope.schema, envelope.schema_version
    meta, pad, data = memoryview(envelope.meta), envelope.pad, memoryview(envelope.data)
    if (
        len(schema.encode()) > limits.max_str_bytes
        or len(version.encode()) > limits.max_str_bytes
        or meta[0] not in _MAP_HEADERS
        or len(meta) > min(limits.max_str_bytes, limits.max_bin_bytes, limits.max_container_len)
        or not _is_bin(memoryview(pad), limits)
        or not _is_bin(data, limits)
    ):
        return None
    return PackedEnvelope(
        schema=schema, version=version, meta=meta, data=data[1 + _BIN_HEADERS[data[0]] :]
    )


def _is_bin(value: memoryview, limits: DecodeLimits) -> bool:
    """``value`` (one packed msgpack value) is a bin of at most ``max_bin_bytes``."""
    width = _BIN_HEADERS.get(value[0])
    return width is not None and len(value) - 1 - width <= limits.max_bin_bytes


#: The first byte of a msgpack map: fixmap, map16, map32.
_MAP_HEADERS = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))


def _read_entries(
    view: memoryview, limits: DecodeLimits
) -> tuple[dict[str, Any], msgpack.Unpacker, bool]:
    """The top-level entries, the unpacker, and whether the array section was taken in place
    at the end of the content."""
    unpacker = msgpack.Unpacker(
        _ChunkReader(view),
        read_size=min(_READ_SIZE, limits.max_decompressed_bytes),
        max_buffer_size=limits.max_decompressed_bytes,
        max_str_len=limits.max_str_bytes,
        max_bin_len=limits.max_bin_bytes,
        max_array_len=limits.max_container_len,
        max_map_len=limits.max_container_len,
        **UNPACKING,
    )
    entries: dict[str, Any] = {}
    ended_in_place = False
    try:
        count = unpacker.read_map_header()
    except msgpack.OutOfData as exc:
        raise CodecError(ReasonCode.BAD_MSGPACK, "empty or truncated content") from exc
    except (ValueError, msgpack.UnpackException) as exc:
        raise CodecError(ReasonCode.BAD_ENVELOPE, "the content is not a msgpack map") from exc
    try:
        if count > len(_ENVELOPE_KEYS):
            raise CodecError(ReasonCode.BAD_ENVELOPE, f"the top-level map has {count} entries")
        for index in range(count):
            key = unpacker.unpack()
            if not isinstance(key, str) or key in entries or key not in _ENVELOPE_KEYS:
                # The envelope is fixed for a major (a minor adds fields inside ``meta``).
                raise CodecError(
                    ReasonCode.BAD_ENVELOPE, f"unknown or repeated top-level key {str(key)[:64]!r}"
                )
            if key == KEY_DATA and index == count - 1:
                in_place = _bin_in_place(view, unpacker.tell())
                if in_place is not None:
                    entries[key] = in_place
                    ended_in_place = True
                    break
            entries[key] = unpacker.unpack()
    except CodecError:
        raise
    except msgpack.OutOfData as exc:
        raise CodecError(ReasonCode.BAD_MSGPACK, "msgpack data ends early (truncated)") from exc
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ValueError covers limit violations, invalid UTF-8 and non-str map keys.
        raise CodecError(ReasonCode.BAD_MSGPACK, f"msgpack: {exc}") from exc
    return entries, unpacker, ended_in_place


def _checked(entries: dict[str, Any]) -> Envelope:
    missing = {KEY_SCHEMA, KEY_VERSION, KEY_META} - entries.keys()
    if missing:
        raise CodecError(ReasonCode.BAD_ENVELOPE, f"the top-level map lacks {sorted(missing)}")
    schema, version, meta = entries[KEY_SCHEMA], entries[KEY_VERSION], entries[KEY_META]
    data = entries.get(KEY_DATA, b"")
    if not isinstance(schema, str) or not isinstance(version, str):
        raise CodecError(ReasonCode.BAD_ENVELOPE, "schema and schema_version must be strings")
    if not isinstance(meta, dict):
        raise CodecError(ReasonCode.BAD_ENVELOPE, f"meta must be a map, not {type(meta).__name__}")
    if not isinstance(data, bytes | memoryview):
        raise CodecError(ReasonCode.BAD_ENVELOPE, f"data must be bin, not {type(data).__name__}")
    pad = entries.get(KEY_PAD, b"")
    if not isinstance(pad, bytes):  # its bytes carry nothing, but it is a bin
        raise CodecError(ReasonCode.BAD_ENVELOPE, f"pad must be bin, not {type(pad).__name__}")
    return Envelope(schema=schema, version=version, meta=meta, data=data)
