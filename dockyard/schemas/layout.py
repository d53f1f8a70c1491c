"""Encode side: a message as its ``meta`` map plus the array section, in one pass.

The walk follows :func:`~dockyard.schemas.wire_plan.plan_of` and reads the models' validated
values directly (a model is immutable and its values are already wire values), so encoding a
group costs a few dict operations per sample instead of a pydantic serializer call per array.

Layout of the array section (a choice of this encoder; decoders only follow the offsets):

* arrays are grouped by field — every ``response_token_ids``, then every
  ``behaviour_logprobs``, … — in the order the fields are first met. Like values next to each
  other compress a little better and faster, and a decoder can check a whole group with one
  reduction (``precheck``);
* an array object that appears in several places (the group's prompt ids shared by every
  sample) is written once, and its descriptors point at the same bytes;
* every array starts at a multiple of 8 bytes, zero padding in between;
* the arrays of kinds marked ``stored`` (float log-probs) come last: the frame writes that tail
  in raw blocks instead of compressing it (``frames.compress_with_stored_tail``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dockyard.schemas.arrays import (
    _NAME_BY_DTYPE,
    ARRAY_ALIGNMENT,
    WIRE_DTYPES,
    ArrayKind,
    wire_dtype_name,
)
from dockyard.schemas.base import WireModel
from dockyard.schemas.wire_plan import plan_of

_ZEROS = tuple(bytes(size) for size in range(ARRAY_ALIGNMENT))


class ArrayLayout:
    """Collects the arrays of one message; converts and places them group by group."""

    __slots__ = ("_groups", "_seen")

    def __init__(self) -> None:
        # (field name, kind) → (kind, [(original array, its descriptor)])
        self._groups: dict[
            tuple[str, ArrayKind], tuple[ArrayKind, list[tuple[np.ndarray, dict[str, Any]]]]
        ] = {}
        # id(original array) → (kind, descriptor); the model keeps the array alive meanwhile.
        self._seen: dict[int, tuple[ArrayKind, dict[str, Any]]] = {}

    def add(self, field: str, arr: np.ndarray, kind: ArrayKind) -> dict[str, Any]:
        """The descriptor of ``arr`` (completed by :meth:`finish`)."""
        seen = self._seen.get(id(arr))
        if seen is not None and seen[0].transform is kind.transform:
            return seen[1]
        descriptor: dict[str, Any] = {"dtype": None, "shape": None, "data": None}
        group = self._groups.get((field, kind))
        if group is None:
            group = self._groups[(field, kind)] = (kind, [])
        group[1].append((arr, descriptor))
        self._seen[id(arr)] = (kind, descriptor)
        return descriptor

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
        size = _align(chunks, size)
        nbytes = wire.nbytes
        descriptor["dtype"] = _NAME_BY_DTYPE[wire.dtype]
        descriptor["shape"] = list(wire.shape)
        descriptor["data"] = [size, nbytes]
        if nbytes:
            chunks.append(wire)  # contiguous: bytes.join takes its buffer, no copy
            size += nbytes
    return size


def _align(chunks: list[Any], size: int) -> int:
    padding = -size % ARRAY_ALIGNMENT
    if padding:
        chunks.append(_ZEROS[padding])
    return size + padding


def _wire_array(arr: np.ndarray, kind: ArrayKind) -> np.ndarray:
    """One array as written: transformed, whitelisted little-endian dtype, C-contiguous."""
    wire = kind.transform(arr)
    if wire.dtype not in _NAME_BY_DTYPE:  # big-endian input (or a dtype the wire cannot carry)
        wire = wire.astype(WIRE_DTYPES[wire_dtype_name(wire.dtype)])
    if not wire.flags.c_contiguous:
        wire = np.ascontiguousarray(wire)
    return wire


def dump_meta(model: WireModel, layout: ArrayLayout) -> dict[str, Any]:
    """``model`` as wire metadata (what ``model_dump(mode="python")`` gives, with array
    descriptors from ``layout`` in place of arrays and enums as their values)."""
    plan = plan_of(type(model))
    values = model.__dict__
    if len(values) != len(plan.field_names):  # something besides fields was cached there
        values = {name: values[name] for name in plan.field_names}
    if plan.plain:
        return values  # only read (by msgpack), never changed
    meta = dict(values)
    for name, kind in plan.arrays:
        arr = meta[name]
        if arr is not None:
            meta[name] = layout.add(name, arr, kind)
    # Plain nested models (sampling, engine, timings, segments…) stay model objects here: the
    # packer turns them into maps itself (``pack_plain_model``), without a Python pass each.
    for name, _ in plan.converted_models:
        nested = meta[name]
        if nested is not None:
            meta[name] = dump_meta(nested, layout)
    for name, _ in plan.converted_model_lists:
        meta[name] = [dump_meta(item, layout) for item in meta[name]]
    for name in plan.enums:
        meta[name] = meta[name].value
    return meta


def pack_plain_model(obj: object) -> dict[str, Any]:
    """msgpack's ``default`` hook: a plain model (no arrays, enums or converted models inside)
    as the map of its fields, which are wire values already."""
    if isinstance(obj, WireModel):
        plan = plan_of(type(obj))
        if plan.plain:
            values = obj.__dict__
            if len(values) == len(plan.field_names):
                return values
            return {name: values[name] for name in plan.field_names}
    raise TypeError(f"cannot put a {type(obj).__name__} on the wire")


@dataclass(frozen=True, slots=True)
class LaidOut:
    meta: dict[str, Any]
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


def lay_out(model: WireModel) -> LaidOut:
    layout = ArrayLayout()
    meta = dump_meta(model, layout)
    return LaidOut(meta, *layout.finish())
