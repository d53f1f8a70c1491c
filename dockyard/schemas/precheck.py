"""Decode side: resolve and check every array of a message once, before pydantic runs.

The field validators in ``arrays`` check one array per call; for a group of G samples that is
5·G Python calls, each with its own numpy reductions. This pass walks the decoded metadata
along :func:`~dockyard.schemas.wire_plan.plan_of`, replaces each array descriptor by a
read-only view of the array section (a slice of one ``frombuffer`` view per dtype), and runs
the value checks once per *group* of arrays: arrays of one kind and dtype that lie back to back
(only padding between them, as this package's encoder writes them) are checked with a single
reduction over the range that covers them all.

The pass only ever says "all checked" or "not sure": anything unexpected (a malformed or
misplaced descriptor, a failed value check — even one caused by non-zero padding) makes the
codec restore the descriptors and validate the message the reference way, array by array, so
refusals carry exactly the reason and field path they always did. Everything it accepts, the
per-array validators would have accepted too: the same whitelist, shape, range and size checks,
and value checks over a superset of the values.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dockyard.schemas.arrays import LOGPROBS, MASK, TOKEN_IDS, VERSIONS, WIRE_DTYPES, ArrayKind
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

    __slots__ = ("_bases", "_blob", "_limits", "_replaced", "_spans")

    def __init__(self, blob: memoryview | bytes, limits: DecodeLimits) -> None:
        self._blob = blob
        self._limits = limits
        self._bases: dict[np.dtype, np.ndarray] = {}
        # (kind, dtype, start element, element count) of every array resolved
        self._spans: list[tuple[ArrayKind, np.dtype, int, int]] = []
        self._replaced: list[tuple[dict[str, Any], str, Any]] = []

    def run(self, cls: type[WireModel], meta: dict[str, Any]) -> None:
        """Resolve every array in ``meta`` in place and check them; NotChecked if unsure."""
        self._walk(cls, meta)
        self._check_values()

    def restore(self) -> None:
        """Put the original descriptors back (after NotChecked)."""
        for container, key, descriptor in reversed(self._replaced):
            container[key] = descriptor
        self._replaced.clear()

    # ------------------------------------------------------------------ the walk

    def _walk(self, cls: type[WireModel], meta: dict[str, Any]) -> None:
        plan = plan_of(cls)
        for name, kind in plan.arrays:
            descriptor = meta.get(name)
            if type(descriptor) is dict:
                meta[name] = self._resolve(descriptor, kind)
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

    def _resolve(self, descriptor: dict[str, Any], kind: ArrayKind) -> np.ndarray:
        # The checks of ``arrays.array_from_wire`` plus the kind's dtype and 1-D rule.
        name = descriptor.get("dtype")
        dtype = _DTYPES_OF_KIND[kind].get(name) if type(name) is str else None
        shape = descriptor.get("shape")
        data = descriptor.get("data")
        if (
            dtype is None
            or len(descriptor) != 3
            or type(shape) is not list
            or len(shape) != 1
            or type(data) is not list
            or len(data) != 2
        ):
            raise NotChecked
        count = shape[0]
        offset, nbytes = data
        if type(count) is not int or type(offset) is not int or type(nbytes) is not int:
            raise NotChecked
        itemsize = dtype.itemsize
        if (
            count < 0
            or offset < 0
            or count > self._limits.max_array_elements
            or count * itemsize != nbytes
            or offset + nbytes > len(self._blob)
            or offset % itemsize
        ):
            raise NotChecked
        base = self._bases.get(dtype)
        if base is None:
            base = np.frombuffer(self._blob, dtype=dtype, count=len(self._blob) // itemsize)
            base.flags.writeable = False
            self._bases[dtype] = base
        start = offset // itemsize
        self._spans.append((kind, dtype, start, count))
        return base[start : start + count]

    # ------------------------------------------------------------------ the value checks

    def _check_values(self) -> None:
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
