"""Encode side: a message's arrays laid out in its array section.

Layout of the array section (a choice of this encoder; decoders only follow the offsets):

* arrays are grouped by field — every ``response_token_ids``, then every
  ``behaviour_logprobs``, … — in the order the fields are first met. Like values next to each
  other compress a little better and faster;
* an array object that appears in several places (the group's prompt ids shared by every
  sample) is written once, and its descriptors point at the same bytes;
* every array starts at a multiple of 8 bytes, zero padding in between;
* the arrays of kinds marked ``stored`` (float log-probs) come last: the frame writes that tail
  in raw blocks instead of compressing it (``frames.compress_with_stored_tail``).

The struct itself is packed by msgspec; its hook (:func:`descriptor_of`) puts each array's
descriptor where the array is.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from dockyard.schemas.arrays import NAME_BY_DTYPE, WIRE_DTYPES, ArrayKind, wire_dtype_name
from dockyard.schemas.base import WireModel, array_fields, nested_array_holders
from dockyard.schemas.errors import CodecError, ReasonCode

_ALIGNMENT = 8
_ZEROS = tuple(bytes(size) for size in range(_ALIGNMENT))


class ArrayLayout:
    """Collects the arrays of one message; converts and places them group by group."""

    __slots__ = ("_groups", "descriptors")

    def __init__(self) -> None:
        # (field name, kind) → (kind, [(original array, its descriptor)])
        self._groups: dict[
            tuple[str, ArrayKind], tuple[ArrayKind, list[tuple[np.ndarray, dict[str, Any]]]]
        ] = {}
        # id(original array) → its descriptor; the message keeps the array alive meanwhile.
        self.descriptors: dict[int, dict[str, Any]] = {}

    def collect(self, model: WireModel) -> None:
        """Every array of ``model`` and of the structs nested in it."""
        cls = type(model)
        for name, kind in array_fields(cls):
            arr = getattr(model, name)
            if arr is not None and id(arr) not in self.descriptors:
                descriptor: dict[str, Any] = {"dtype": None, "shape": None, "data": None}
                group = self._groups.get((name, kind))
                if group is None:
                    group = self._groups[(name, kind)] = (kind, [])
                group[1].append((arr, descriptor))
                self.descriptors[id(arr)] = descriptor
        for name in nested_array_holders(cls):
            nested = getattr(model, name)
            if nested is not None:
                self.collect(nested)

    def finish(self) -> tuple[list[Any], int, int, int]:
        """The array section as buffers to join, its size, and how many of the buffers (at the
        end) hold the stored arrays and their size; completes every descriptor."""
        chunks: list[Any] = []
        size = 0
        stored_from = stored_offset = 0
        for stored in (False, True):
            if stored:  # the stored arrays go last: the frame ends with them (``frames``)
                stored_from, stored_offset = len(chunks), size
            for kind, entries in self._groups.values():
                if kind.stored is stored:
                    size = _place_group(kind, entries, chunks, size)
        return chunks, size, len(chunks) - stored_from, size - stored_offset


def _place_group(
    kind: ArrayKind,
    entries: list[tuple[np.ndarray, dict[str, Any]]],
    chunks: list[Any],
    size: int,
) -> int:
    for arr, descriptor in entries:
        wire = _wire_array(arr, kind)
        padding = -size % _ALIGNMENT
        if padding:
            chunks.append(_ZEROS[padding])
            size += padding
        nbytes = wire.nbytes
        descriptor["dtype"] = NAME_BY_DTYPE[wire.dtype]
        descriptor["shape"] = list(wire.shape)
        descriptor["data"] = [size, nbytes]
        if nbytes:
            chunks.append(wire)  # contiguous: bytes.join takes its buffer, no copy
            size += nbytes
    return size


def _wire_array(arr: np.ndarray, kind: ArrayKind) -> np.ndarray:
    """One array as written: transformed, whitelisted little-endian dtype, C-contiguous."""
    wire = kind.transform(arr)
    if wire.dtype not in NAME_BY_DTYPE:  # big-endian input (or a dtype the wire cannot carry)
        wire = wire.astype(WIRE_DTYPES[wire_dtype_name(wire.dtype)])
    if not wire.flags.c_contiguous:
        wire = np.ascontiguousarray(wire)
    return wire


class _Encoding(threading.local):
    layout: ArrayLayout | None = None


_ENCODING = _Encoding()


def descriptor_of(obj: Any) -> Any:
    """msgspec's ``enc_hook``: an array of the message being encoded → its descriptor."""
    layout = _ENCODING.layout
    if isinstance(obj, np.ndarray) and layout is not None:
        descriptor = layout.descriptors.get(id(obj))
        if descriptor is not None:
            return descriptor
        raise CodecError(ReasonCode.UNENCODABLE, "an array outside an array field")
    raise TypeError(f"cannot put a {type(obj).__name__} on the wire")


@dataclass(frozen=True, slots=True)
class LaidOut:
    #: The array section's buffers; the last ``stored_chunks`` hold the stored arrays.
    chunks: list[Any]
    nbytes: int
    stored_chunks: int = 0
    stored_nbytes: int = 0

    @property
    def compressed_chunks(self) -> list[Any]:
        return self.chunks[: len(self.chunks) - self.stored_chunks]

    @property
    def stored(self) -> list[Any]:
        return self.chunks[len(self.chunks) - self.stored_chunks :]

    def array_section(self) -> bytes:
        return b"".join(self.chunks)


def lay_out(model: WireModel) -> tuple[ArrayLayout, LaidOut]:
    layout = ArrayLayout()
    layout.collect(model)
    return layout, LaidOut(*layout.finish())


#: Encoders hold no state between calls (and the GIL during one): one serves every thread.
_ENCODER = msgspec.msgpack.Encoder(enc_hook=descriptor_of)


def pack_meta(model: WireModel, layout: ArrayLayout) -> bytes:
    """``model`` as its msgpack map, each array as its descriptor from ``layout``."""
    _ENCODING.layout = layout
    try:
        return _ENCODER.encode(model)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CodecError(ReasonCode.UNENCODABLE, f"msgpack cannot encode: {exc}") from exc
    finally:
        _ENCODING.layout = None
