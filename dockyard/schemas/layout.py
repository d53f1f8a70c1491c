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
* every array starts at a multiple of 8 bytes, zero padding in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dockyard.schemas.arrays import (
    _NAME_BY_DTYPE,
    _UINT16_MAX,
    ARRAY_ALIGNMENT,
    WIRE_DTYPES,
    ArrayKind,
    narrow_unsigned,
    narrow_unsigned_max,
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

    def finish(self) -> tuple[list[Any], int]:
        """The array section as buffers to join, and its size; completes every descriptor."""
        chunks: list[Any] = []
        size = 0
        for kind, entries in self._groups.values():
            wires = _wire_arrays(kind, [arr for arr, _ in entries])
            for (_, descriptor), wire in zip(entries, wires, strict=True):
                padding = -size % ARRAY_ALIGNMENT
                if padding:
                    chunks.append(_ZEROS[padding])
                    size += padding
                nbytes = wire.nbytes
                descriptor["dtype"] = _NAME_BY_DTYPE[wire.dtype]
                descriptor["shape"] = list(wire.shape)
                descriptor["data"] = [size, nbytes]
                if nbytes:
                    chunks.append(wire)  # contiguous: bytes.join takes its buffer, no copy
                    size += nbytes
        return chunks, size


def _wire_array(arr: np.ndarray, kind: ArrayKind) -> np.ndarray:
    """One array as written: transformed, whitelisted little-endian dtype, C-contiguous."""
    wire = kind.transform(arr)
    if wire.dtype not in _NAME_BY_DTYPE:  # big-endian input (or a dtype the wire cannot carry)
        wire = wire.astype(WIRE_DTYPES[wire_dtype_name(wire.dtype)])
    if not wire.flags.c_contiguous:
        wire = np.ascontiguousarray(wire)
    return wire


def _wire_arrays(kind: ArrayKind, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``_wire_array`` of each array; one numpy call per group where it gives the same result.

    Narrowing is per array, but when the largest value of the whole group fits 16 bits every
    array narrows to uint16, so the group is narrowed with one ``max`` and one ``astype`` over
    its concatenation and each array is a (contiguous) slice of the result.
    """
    if kind.transform is narrow_unsigned and len(arrays) > 1:
        dtype = arrays[0].dtype
        if (
            dtype.kind in "iu"
            and dtype.itemsize > 2
            and all(arr.dtype == dtype and arr.ndim == 1 for arr in arrays)
        ):
            joined = np.concatenate(arrays)
            if joined.size and int(narrow_unsigned_max(joined)) <= _UINT16_MAX:
                narrowed = joined.astype(np.uint16)
                slices: list[np.ndarray] = []
                start = 0
                for arr in arrays:
                    end = start + arr.shape[0]
                    slices.append(narrowed[start:end])
                    start = end
                return slices
    return [_wire_array(arr, kind) for arr in arrays]


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
    for name, _ in plan.models:
        nested = meta[name]
        if nested is not None:
            meta[name] = _dump_nested(nested, layout)
    for name, _ in plan.model_lists:
        meta[name] = [_dump_nested(item, layout) for item in meta[name]]
    for name in plan.enums:
        meta[name] = meta[name].value
    return meta


def _dump_nested(model: WireModel, layout: ArrayLayout) -> dict[str, Any]:
    # Most nested models (sampling, engine, timings, segments) are plain: skip the call.
    values = model.__dict__
    plan = plan_of(type(model))
    if plan.plain and len(values) == len(plan.field_names):
        return values
    return dump_meta(model, layout)


@dataclass(frozen=True, slots=True)
class LaidOut:
    meta: dict[str, Any]
    chunks: list[Any]
    nbytes: int

    def array_section(self) -> bytes:
        return b"".join(self.chunks)


def lay_out(model: WireModel) -> LaidOut:
    layout = ArrayLayout()
    meta = dump_meta(model, layout)
    chunks, nbytes = layout.finish()
    return LaidOut(meta, chunks, nbytes)
