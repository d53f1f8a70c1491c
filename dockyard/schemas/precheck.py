"""Decode side: resolve and check every array of a message once, before pydantic runs.

The field validators in ``arrays`` check one array per call, each with its own numpy
reductions (for a 2.x group of G samples that was 5·G calls; a 3.0 group has a handful of
arrays whatever G). This pass walks the decoded metadata
along :func:`~dockyard.schemas.wire_plan.plan_of`, replaces each array descriptor by a
read-only view of the array section (a slice of one ``frombuffer`` view per dtype), and runs
the value checks once per *group* of arrays: arrays of one kind and dtype that lie back to back
(only padding between them, as this package's encoder writes them) are checked with a single
reduction over the range that covers them all.

It also expands *columns* (``layout``: one array per field for all items of a list, plus a
``rows`` table of ``(start, count)``): each item gets its slice, and each column is value-checked
with one reduction. Columns are structural, so a malformed one is refused at once
(``CodecError``, ``bad_array``) and every column is expanded before anything else can fail.

For everything else the pass only ever says "all checked" or "not sure": anything unexpected (a
malformed or misplaced descriptor, a failed value check — even one caused by non-zero padding)
makes the codec restore the descriptors and validate the message the reference way, array by
array (column slices included), so refusals carry exactly the reason and field path they always
did. Everything it accepts, the per-array validators would have accepted too: the same
whitelist, shape, range and size checks, and value checks over a superset of the values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dockyard.schemas.arrays import (
    ARRAY_ALIGNMENT,
    LOGPROBS,
    MASK,
    TOKEN_IDS,
    VERSIONS,
    WIRE_DTYPES,
    ArrayKind,
)
from dockyard.schemas.base import WireModel
from dockyard.schemas.errors import CodecError, ReasonCode
from dockyard.schemas.layout import COLUMNS_KEY
from dockyard.schemas.limits import DecodeLimits
from dockyard.schemas.wire_plan import WirePlan, plan_of

#: Per kind: wire dtype name → dtype, for the dtypes that kind accepts.
_DTYPES_OF_KIND: dict[ArrayKind, dict[str, np.dtype]] = {
    kind: {name: dtype for name, dtype in WIRE_DTYPES.items() if dtype in kind.dtypes}
    for kind in (TOKEN_IDS, LOGPROBS, VERSIONS, MASK)
}


class NotChecked(Exception):
    """The fast pass cannot vouch for the message; validate it the reference way."""


_ROWS_DTYPES = {name: WIRE_DTYPES[name] for name in ("uint32", "uint64")}
_COLUMN_KEYS = frozenset({"dtype", "shape", "data", "rows"})

#: Arrays of a group at most this many bytes apart are checked with one covering reduction:
#: such a gap can only be alignment padding (zeros, which pass every check).
_MAX_GAP_BYTES = 7


class ArrayPrecheck:
    """One pass over one message's metadata (``run``), undoable (``restore``)."""

    __slots__ = ("_bases", "_blob", "_limits", "_replaced", "_spans", "_unsure")

    def __init__(self, blob: memoryview | bytes, limits: DecodeLimits) -> None:
        self._blob = blob
        self._limits = limits
        self._bases: dict[np.dtype, np.ndarray] = {}
        # (kind, dtype, start element, element count) of every array resolved
        self._spans: list[tuple[ArrayKind, np.dtype, int, int]] = []
        self._replaced: list[tuple[dict[str, Any], str, Any]] = []
        self._unsure = False

    def run(self, cls: type[WireModel], meta: dict[str, Any]) -> None:
        """Resolve every array in ``meta`` in place and check them; NotChecked if unsure,
        CodecError for a malformed column."""
        self._walk(cls, meta)
        if self._unsure:
            raise NotChecked
        self.check_values()

    def restore(self) -> None:
        """Put the original descriptors back (after NotChecked)."""
        for container, key, descriptor in reversed(self._replaced):
            container[key] = descriptor
        self._replaced.clear()

    # ------------------------------------------------------------------ the walk

    def _walk(self, cls: type[WireModel], meta: dict[str, Any]) -> None:
        # Never stops half-way (it notes ``_unsure`` instead): every column must be expanded
        # even when the reference path ends up validating the message.
        plan = plan_of(cls)
        columns = meta.pop(COLUMNS_KEY, None)
        filled = () if columns is None else self._expand_columns(plan, meta, columns)
        for name, kind in plan.arrays:
            descriptor = meta.get(name)
            if type(descriptor) is dict:
                arr = self._resolve(descriptor, kind)
                if arr is None:
                    self._unsure = True
                    continue
                meta[name] = arr
                self._replaced.append((meta, name, descriptor))
        # Anything shaped unexpectedly is left alone: pydantic reports it as before.
        for name, nested_cls in plan.array_models:
            nested = meta.get(name)
            if type(nested) is dict:
                self._walk(nested_cls, nested)
        for name, item_cls in plan.array_model_lists:
            items = meta.get(name)
            if name in filled and not plan_of(item_cls).nested_arrays:
                continue  # the columns gave the items every array they can have
            if type(items) is list:
                for item in items:
                    if type(item) is dict:
                        self._walk(item_cls, item)

    def _resolve(self, descriptor: dict[str, Any], kind: ArrayKind) -> np.ndarray | None:
        """A view of the described array, or None when unsure about the descriptor."""
        # The checks of ``arrays.array_from_wire`` plus the kind's dtype and 1-D rule.
        name = descriptor.get("dtype")
        shape = descriptor.get("shape")
        data = descriptor.get("data")
        if (
            type(name) is not str
            or len(descriptor) != 3
            or type(shape) is not list
            or len(shape) != 1
            or type(data) is not list
            or len(data) != 2
        ):
            return None
        count = shape[0]
        offset, nbytes = data
        if type(count) is not int or type(offset) is not int or type(nbytes) is not int:
            return None
        return self.view(name, count, offset, nbytes, kind)

    def view(
        self, dtype_name: str, count: int, offset: int, nbytes: int, kind: ArrayKind
    ) -> np.ndarray | None:
        """The 1-D array of ``count`` ``dtype_name`` values at ``offset`` (``nbytes`` long), or
        None when that is not an array of ``kind`` inside the section."""
        dtype = _DTYPES_OF_KIND[kind].get(dtype_name)
        if dtype is None:
            return None
        itemsize = dtype.itemsize
        if (
            count < 0
            or offset < 0
            or count > self._limits.max_array_elements
            or count * itemsize != nbytes
            or offset + nbytes > len(self._blob)
            or offset % ARRAY_ALIGNMENT
        ):
            return None
        base = self._bases.get(dtype)  # ``_base``, inlined: this runs for every array
        if base is None:
            base = self._base(dtype)
        start = offset // itemsize
        self._spans.append((kind, dtype, start, count))
        return base[start : start + count]

    def _base(self, dtype: np.dtype) -> np.ndarray:
        """The whole array section as ``dtype`` (one view per dtype, sliced per array)."""
        base = self._bases.get(dtype)
        if base is None:
            base = np.frombuffer(self._blob, dtype=dtype, count=len(self._blob) // dtype.itemsize)
            base.flags.writeable = False
            self._bases[dtype] = base
        return base

    # ------------------------------------------------------------------ columns

    def _expand_columns(self, plan: WirePlan, meta: dict[str, Any], columns: Any) -> set[str]:
        """Give each item its slice of every column; the lists whose items got every array
        field from columns."""
        filled: set[str] = set()
        if type(columns) is not dict:
            raise _bad_column(COLUMNS_KEY, "must be a map of list field → columns")
        for list_name, fields in columns.items():
            kinds = plan.columns.get(list_name) if type(list_name) is str else None
            where = f"{COLUMNS_KEY}.{str(list_name)[:64]}"
            if kinds is None:
                raise _bad_column(where, "names no list of models with array fields")
            if type(fields) is not dict:
                raise _bad_column(where, "must be a map of field → column")
            items = meta.get(list_name)
            if type(items) is not list:
                continue  # no list to fill: pydantic refuses the field itself, by its path
            for field, column in fields.items():
                kind = kinds.get(field) if type(field) is str else None
                if kind is None:
                    raise _bad_column(f"{where}.{str(field)[:64]}", "is not an array field")
                self._expand_column(f"{where}.{field}", field, kind, column, items)
            if len(fields) == len(kinds):
                filled.add(list_name)
        return filled

    def _expand_column(
        self, where: str, field: str, kind: ArrayKind, column: Any, items: list[Any]
    ) -> None:
        if type(column) is not dict or column.keys() != _COLUMN_KEYS:
            raise _bad_column(where, "a column is a map with keys dtype, shape, data, rows")
        values = self._column_array(where, column, _DTYPES_OF_KIND[kind], 1)
        rows = self._column_array(f"{where}.rows", column["rows"], _ROWS_DTYPES, 2)
        total = values.shape[0]
        if rows.shape != (len(items), 2):
            raise _bad_column(where, f"rows has shape {list(rows.shape)} for {len(items)} items")
        for item, (start, count) in zip(items, rows.tolist(), strict=True):
            end = start + count  # Python ints: no overflow
            if end > total:
                raise _bad_column(where, f"a row reaches past the column's {total} values")
            if type(item) is not dict:
                continue  # pydantic refuses the item itself, by its path
            if field in item:
                raise _bad_column(where, "an item carries the column's field itself as well")
            item[field] = values[start:end]
        if total:
            dtype = values.dtype
            self._spans.append((kind, dtype, column["data"][0] // dtype.itemsize, total))

    def _column_array(
        self, where: str, descriptor: Any, dtypes: dict[str, np.dtype], ndim: int
    ) -> np.ndarray:
        """A checked view of a column's values (1-D) or rows (2-D); CodecError otherwise."""
        # Runs twice per column of every message: plain Python checks, no numpy reductions.
        if type(descriptor) is not dict:
            raise _bad_column(where, "must be an array descriptor")
        name, shape, data = descriptor.get("dtype"), descriptor.get("shape"), descriptor.get("data")
        dtype = dtypes.get(name) if type(name) is str else None
        if dtype is None:
            raise _bad_column(where, f"dtype {str(name)[:32]!r} is not allowed here")
        if (
            type(shape) is not list
            or len(shape) != ndim
            or type(data) is not list
            or len(data) != 2
        ):
            raise _bad_column(where, "needs shape (non-negative ints) and data [offset, nbytes]")
        count = 1
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise _bad_column(
                    where, "needs shape (non-negative ints) and data [offset, nbytes]"
                )
            count *= dim
        offset, nbytes = data
        if type(offset) is not int or type(nbytes) is not int or offset < 0:
            raise _bad_column(where, "needs shape (non-negative ints) and data [offset, nbytes]")
        if count > self._limits.max_array_elements:
            raise CodecError(
                ReasonCode.ARRAY_TOO_LARGE,
                f"{where}: {count} elements exceed the limit of {self._limits.max_array_elements}",
            )
        if (
            count * dtype.itemsize != nbytes
            or offset % ARRAY_ALIGNMENT
            or offset + nbytes > len(self._blob)
        ):
            raise _bad_column(where, f"data {data} does not fit shape {shape} in the section")
        start = offset // dtype.itemsize
        view = self._base(dtype)[start : start + count]
        return view if ndim == 1 else view.reshape(shape)

    # ------------------------------------------------------------------ the value checks

    def check_values(self) -> None:
        """Run the value checks of every array resolved so far; NotChecked if one fails."""
        limits = self._limits
        groups: dict[tuple[ArrayKind, np.dtype], list[tuple[int, int]]] = {}
        for kind, dtype, start, count in self._spans:
            if kind.needs_values_check(dtype, limits):
                spans = groups.get((kind, dtype))
                if spans is None:
                    spans = groups[(kind, dtype)] = []
                spans.append((start, count))
        for (kind, dtype), spans in groups.items():
            base = self._bases[dtype]
            max_gap = _MAX_GAP_BYTES // dtype.itemsize
            spans.sort()
            first = spans[0][0]
            end = first
            for start, count in spans:
                if start - end > max_gap:
                    break  # not back to back: check array by array
                end = max(end, start + count)
            else:
                if not kind.values_ok(base[first:end], limits):
                    raise NotChecked
                continue
            for start, count in spans:
                if not kind.values_ok(base[start : start + count], limits):
                    raise NotChecked


def _bad_column(where: str, message: str) -> CodecError:
    return CodecError(ReasonCode.BAD_ARRAY, f"{where}: {message}")
