"""Decode side: resolve and check every array of a message once, before pydantic runs.

The field validators in ``arrays`` check one array per call, each with its own numpy
reductions (for a 2.x group of G samples that was 5·G calls; a 3.0 group has a handful of
arrays whatever G). This pass walks the decoded metadata
along :func:`~dockyard.schemas.wire_plan.plan_of`, replaces each array descriptor by a
read-only view of the array section (a slice of one ``frombuffer`` view per dtype), and runs
the value checks once per *group* of arrays: arrays of one kind and dtype that lie back to back
(only padding between them, as this package's encoder writes them) are checked with a single
reduction over the range that covers them all.

For everything else the pass only ever says "all checked" or "not sure": anything unexpected (a
malformed or misplaced descriptor, a failed value check — even one caused by non-zero padding)
makes the codec restore the descriptors and validate the message the reference way, array by
array (column slices included), so refusals carry exactly the reason and field path they always
did. Everything it accepts, the per-array validators would have accepted too: the same
whitelist, shape, alignment, range and size checks, and value checks over a superset of the
values.
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
from dockyard.schemas.limits import DecodeLimits
from dockyard.schemas.wire_plan import plan_of

#: Per kind: wire dtype name → dtype, for the dtypes that kind accepts.
_DTYPES_OF_KIND: dict[ArrayKind, dict[str, np.dtype]] = {
    kind: {name: dtype for name, dtype in WIRE_DTYPES.items() if dtype in kind.dtypes}
    for kind in (TOKEN_IDS, LOGPROBS, VERSIONS, MASK)
}


class NotChecked(Exception):
    """The fast pass cannot vouch for the message; validate it the reference way."""


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
        """Resolve every array in ``meta`` in place and check them; NotChecked if unsure."""
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
        # Never stops half-way (it notes ``_unsure`` instead): ``restore`` undoes it all.
        plan = plan_of(cls)
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
