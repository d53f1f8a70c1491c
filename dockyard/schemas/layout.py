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
  in raw blocks instead of compressing it (``frames.compress_with_stored_tail``);
* the arrays of a list of models (the samples of a 2.0 rollout, written by the legacy classes;
  3.0 groups are columns by schema) travel as *columns*: one array per field
  holding every item's values back to back, plus a ``rows`` array of ``(start, count)`` per item,
  under the parent's ``"@columns"`` key. A group of G samples then costs a handful of
  descriptors instead of 5·G, and the decoder checks each column with one reduction. A field is
  written as a column when every item has an array of one dtype there; otherwise each item
  carries its own descriptor (decoders accept both).
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
    narrow_unsigned,
    unchanged,
    wire_dtype_name,
)
from dockyard.schemas.base import WireModel
from dockyard.schemas.wire_plan import plan_of

_ZEROS = tuple(bytes(size) for size in range(ARRAY_ALIGNMENT))
#: The key of a model's meta map that holds the columns of its lists (not a field name: field
#: names are identifiers).
COLUMNS_KEY = "@columns"
_UINT32_LIMIT = 1 << 32


@dataclass(slots=True)
class _Column:
    kind: ArrayKind
    #: Distinct arrays (by identity) in order of first use, and each item's index into them.
    arrays: list[np.ndarray]
    item_array: list[int]
    descriptor: dict[str, Any]


class ArrayLayout:
    """Collects the arrays of one message; converts and places them group by group."""

    __slots__ = ("_columns", "_groups", "_seen")

    def __init__(self) -> None:
        self._columns: list[_Column] = []
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

    def add_column(self, arrays: list[np.ndarray], kind: ArrayKind) -> dict[str, Any] | None:
        """The column descriptor of one field of a list's items (completed by :meth:`finish`),
        or None when the arrays cannot share one (a missing value, mixed dtypes, not 1-D)."""
        dtype = getattr(arrays[0], "dtype", None)
        if dtype is None:
            return None
        index_of: dict[int, int] = {}
        distinct: list[np.ndarray] = []
        item_array: list[int] = []
        for arr in arrays:
            key = id(arr)
            index = index_of.get(key)
            if index is None:
                if type(arr) is not np.ndarray or arr.ndim != 1:
                    return None
                if arr.dtype is not dtype and arr.dtype != dtype:
                    return None
                index = index_of[key] = len(distinct)
                distinct.append(arr)
            item_array.append(index)
        descriptor: dict[str, Any] = {"dtype": None, "shape": None, "data": None, "rows": None}
        self._columns.append(_Column(kind, distinct, item_array, descriptor))
        return descriptor

    def finish(self) -> tuple[list[Any], int, int, int]:
        """The array section as buffers to join, its size, and how many of the buffers (at the
        end) hold the stored arrays and their size; completes every descriptor."""
        chunks: list[Any] = []
        size = 0
        rows_written: dict[tuple[int, ...], dict[str, Any]] = {}
        stored_from = stored_offset = 0
        for stored in (False, True):
            if stored:  # the stored arrays go last: the frame ends with them (``frames``)
                stored_from, stored_offset = len(chunks), size
            for column in self._columns:
                if column.kind.stored is stored:
                    size = _place_column(column, chunks, size, rows_written)
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


def _place_column(
    column: _Column,
    chunks: list[Any],
    size: int,
    rows_written: dict[tuple[int, ...], dict[str, Any]],
) -> int:
    """Append a column's values (the distinct arrays back to back) and its rows array; columns
    with equal rows (a sample's response arrays all have its length) share one rows array."""
    arrays = column.arrays
    if column.kind.transform is narrow_unsigned:
        # One narrowing decision for the whole column: one dtype, one max, one astype.
        joined = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        parts = [_wire_array(joined, column.kind)]
    elif column.kind.transform is unchanged and arrays[0].dtype in _NAME_BY_DTYPE:
        # The common case (float32 log-probs, bool masks): written as they are.
        parts = [arr if arr.flags.c_contiguous else np.ascontiguousarray(arr) for arr in arrays]
    else:
        parts = [_wire_array(arr, column.kind) for arr in arrays]
    starts: list[int] = []
    lengths: list[int] = []
    total = 0
    for arr in arrays:
        starts.append(total)
        length = arr.shape[0]
        lengths.append(length)
        total += length
    size = _align(chunks, size)
    offset = size
    for part in parts:  # same dtype: each part stays aligned to its item size
        nbytes = part.nbytes
        if nbytes:
            chunks.append(part)
            size += nbytes
    descriptor = column.descriptor
    descriptor["dtype"] = _NAME_BY_DTYPE[parts[0].dtype]
    descriptor["shape"] = [total]
    descriptor["data"] = [offset, size - offset]
    flat: list[int] = []
    for index in column.item_array:
        flat.append(starts[index])
        flat.append(lengths[index])
    key = tuple(flat)
    rows_descriptor = rows_written.get(key)
    if rows_descriptor is None:
        rows = np.array(flat, dtype=np.uint32 if total < _UINT32_LIMIT else np.uint64)
        size = _align(chunks, size)
        chunks.append(rows)
        rows_descriptor = rows_written[key] = {
            "dtype": _NAME_BY_DTYPE[rows.dtype],
            "shape": [len(column.item_array), 2],
            "data": [size, rows.nbytes],
        }
        size += rows.nbytes
    descriptor["rows"] = rows_descriptor
    return size


def _wire_array(arr: np.ndarray, kind: ArrayKind) -> np.ndarray:
    """One array as written: transformed, whitelisted little-endian dtype, C-contiguous."""
    wire = kind.transform(arr)
    if wire.dtype not in _NAME_BY_DTYPE:  # big-endian input (or a dtype the wire cannot carry)
        wire = wire.astype(WIRE_DTYPES[wire_dtype_name(wire.dtype)])
    if not wire.flags.c_contiguous:
        wire = np.ascontiguousarray(wire)
    return wire


def dump_meta(
    model: WireModel, layout: ArrayLayout, in_columns: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``model`` as wire metadata (what ``model_dump(mode="python")`` gives, with array
    descriptors from ``layout`` in place of arrays and enums as their values). Array fields
    named in ``in_columns`` are left out: the parent wrote them as columns."""
    plan = plan_of(type(model))
    values = model.__dict__
    if len(values) != len(plan.field_names):  # something besides fields was cached there
        values = {name: values[name] for name in plan.field_names}
    if plan.plain:
        return values  # only read (by msgpack), never changed
    meta = dict(values)
    for name, kind in plan.arrays:
        if name in in_columns:
            del meta[name]
            continue
        arr = meta[name]
        if arr is not None:
            meta[name] = layout.add(name, arr, kind)
    # Plain nested models (sampling, engine, timings, segments…) stay model objects here: the
    # packer turns them into maps itself (``pack_plain_model``), without a Python pass each.
    for name, _ in plan.converted_models:
        nested = meta[name]
        if nested is not None:
            meta[name] = dump_meta(nested, layout)
    columns: dict[str, dict[str, Any]] = {}
    for name, _ in plan.converted_model_lists:
        items = meta[name]
        column_kinds = plan.columns.get(name)
        if column_kinds and items:
            placed = _dump_columns(items, column_kinds, layout)
            if placed:
                columns[name] = placed
                written = frozenset(placed)
                meta[name] = [dump_meta(item, layout, written) for item in items]
                continue
        meta[name] = [dump_meta(item, layout) for item in items]
    if columns:
        meta[COLUMNS_KEY] = columns
    for name in plan.enums:
        meta[name] = meta[name].value
    return meta


def _dump_columns(
    items: list[WireModel], kinds: dict[str, ArrayKind], layout: ArrayLayout
) -> dict[str, dict[str, Any]]:
    """Column descriptors of the items' array fields that can travel as columns."""
    placed: dict[str, dict[str, Any]] = {}
    for name, kind in kinds.items():
        descriptor = layout.add_column([item.__dict__[name] for item in items], kind)
        if descriptor is not None:
            placed[name] = descriptor
    return placed


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
