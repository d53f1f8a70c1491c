"""Struct-of-arrays helpers: the rows of a group (samples, scores) carried field by field.

Schema 3.0 of ``rollout`` and ``scored_rollout`` holds a group's G samples and G scores as
*columns* — one list (or one concatenated array) per field — instead of one struct per sample.
Decoding then costs a handful of list and array checks per group, whatever G, and the
trainer reads the arrays it stacks without touching a per-sample object. The row structs
(``RolloutSample``, ``SampleScore``) stay the way to build a group and to look at one sample:
a column container builds its rows on first access, from values it has already checked.

This module holds what the containers share: the columns of a *plain* row struct (only scalar,
string, list and dict fields — ``SamplingParams``, ``EngineInfo``, ``SampleTimings``), derived
from the row so that its constraints are defined once; ragged array helpers; and the "every
column has G entries" check.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache, cached_property
from typing import Any, ClassVar

import msgspec
import numpy as np

from dockyard.schemas.base import (
    WireModel,
    array_fields,
    check_fields,
    check_finite_all,
    holds_arrays,
)
from dockyard.schemas.errors import ReasonCode, WireError


class RowColumns(WireModel, frozen=True, dict=True, gc=True, kw_only=True):
    """Base of a group's columns (samples, scores), which read as a sequence of row structs.

    Subclasses define ``_build_rows`` and ``__len__``. The built rows are a cache in the
    instance ``__dict__``, not content: equality, the codec, pickling and
    ``msgspec.structs.replace`` see the columns only. (A ``__dict__`` needs the garbage
    collector's tracking: one such struct per message.)
    """

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows)

    def __getitem__(self, index: int) -> Any:
        return self.rows[index]

    def __len__(self) -> int:
        raise NotImplementedError

    @cached_property
    def rows(self) -> list[Any]:
        """Every row as its struct (views of the columns' arrays), built once."""
        return self._build_rows()

    def _build_rows(self) -> list[Any]:
        raise NotImplementedError

    def keep_rows(self, rows: Sequence[Any]) -> None:
        """Remember the rows these columns were built from (what ``rows`` would build)."""
        self.__dict__["rows"] = list(rows)


class PlainColumns(WireModel, frozen=True, kw_only=True):
    """Base of the structs :func:`plain_columns` derives: the columns of a plain row struct."""

    #: The row struct whose fields these columns hold.
    ROW: ClassVar[type[WireModel]]

    def __post_init__(self) -> None:
        # The row's finite floats, entry by entry (None entries: an optional field left out).
        for name, minimum in self.ROW.FINITE.items():
            column = getattr(self, name)
            if column is not None:
                check_finite_all(column, name, minimum)


@cache
def plain_columns(row: type[WireModel]) -> type[PlainColumns]:
    """A struct with one list per field of the plain struct ``row`` (entry i: row i's value).

    Each list item keeps the field's type and constraints (``Meta(ge=0)`` on the row field
    becomes a bound on every entry). A field with a default may be absent (``None``): a frame
    of an older minor version, written before the field existed, means "the default for every
    row". The encoder always writes every column.

    The struct is named ``<Row>Columns`` and claims the row's module: bind it to that name there
    (``SamplingParamsColumns = plain_columns(SamplingParams)``) so that pickle finds it.
    """
    if holds_arrays(row):
        raise TypeError(f"{row.__name__} is not a plain struct: its columns must be written out")
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for info in msgspec.structs.fields(row):
        if info.required:
            fields.append((info.name, list[info.type]))  # type: ignore[name-defined]  # a type built at run time
        else:
            fields.append((info.name, list[info.type] | None, None))  # type: ignore[name-defined]  # built at run time
    columns = msgspec.defstruct(
        f"{row.__name__}Columns",
        fields,
        bases=(PlainColumns,),
        module=row.__module__,
        namespace={"ROW": row, "__doc__": f"The columns of a list of {row.__name__}."},
        kw_only=True,
    )
    return columns  # type: ignore[return-value]  # defstruct says Struct; its base is PlainColumns


def columns_from_rows(row: type[WireModel], rows: Sequence[WireModel]) -> dict[str, list[Any]]:
    """The column values of ``rows`` (instances of the plain struct ``row``)."""
    return {name: [getattr(item, name) for item in rows] for name in row.__struct_fields__}


def rows_from_columns(row: type[WireModel], columns: WireModel, count: int) -> list[Any]:
    """``count`` instances of the plain struct ``row`` from its checked, complete columns."""
    per_field = [(name, getattr(columns, name)) for name in row.__struct_fields__]
    return [row(**{name: column[index] for name, column in per_field}) for index in range(count)]


def check_counts(columns: WireModel, count: int, what: str) -> None:
    """Every list column of ``columns`` (nested plain columns included) has ``count`` entries.

    A nested plain column left out (``None``: a frame of an older minor, written before that
    field existed) is filled in here with the field's default for every row, so that the
    columns read the same as those of the same rows built in Python. Called from the
    containers' ``__post_init__``, on a struct not yet handed out.
    """
    for name in _list_fields(type(columns)):
        value = getattr(columns, name)
        if type(value) is list:  # nearly every column: one test, then its length
            if len(value) != count:
                raise WireError(
                    ReasonCode.LENGTH_MISMATCH,
                    f"{what}.{name} has {len(value)} entries for {count} samples",
                )
        elif value is None and isinstance(columns, PlainColumns):
            msgspec.structs.force_setattr(columns, name, _defaults(columns.ROW, name, count))
    for name in _nested_columns(type(columns)):
        check_counts(getattr(columns, name), count, f"{what}.{name}")


def _defaults(row: type[WireModel], name: str, count: int) -> list[Any]:
    info = next(info for info in msgspec.structs.fields(row) if info.name == name)
    if info.default_factory is not msgspec.NODEFAULT:
        return [info.default_factory() for _ in range(count)]
    return [info.default] * count


@cache
def _list_fields(cls: type[WireModel]) -> tuple[str, ...]:
    special = {name for name, _ in array_fields(cls)} | set(_nested_columns(cls))
    return tuple(name for name in cls.__struct_fields__ if name not in special)


@cache
def _nested_columns(cls: type[WireModel]) -> tuple[str, ...]:
    return tuple(
        info.name
        for info in msgspec.structs.fields(cls)
        if isinstance(info.type, type) and issubclass(info.type, PlainColumns)
    )


def check_columns(columns: WireModel, count: int, what: str) -> None:
    """A container's own field checks, then every column of ``count`` entries."""
    check_fields(columns)
    check_counts(columns, count, what)


def offsets_of(lengths: Sequence[int]) -> np.ndarray:
    """Start offsets of ragged rows (``len(lengths) + 1`` entries, the last = the total)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def split(values: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
    """Views of ``values`` cut into consecutive rows of ``lengths``."""
    views = []
    start = 0
    for length in lengths:
        end = start + length
        views.append(values[start:end])
        start = end
    return views


def concatenate(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays back to back (the single array itself when there is one), in one dtype that
    holds every value exactly."""
    if len(arrays) == 1:
        return arrays[0]
    dtype = np.result_type(*arrays)
    if dtype.kind == "f" and all(arr.dtype.kind in "iu" for arr in arrays):
        # numpy joins int64 and uint64 as float64, which loses integers past 2**53. The integer
        # columns (token ids, weight versions) hold checked non-negative values: uint64 holds
        # every one of them.
        dtype = np.dtype(np.uint64)
    return np.concatenate(arrays, dtype=dtype, casting="unsafe")


def check_total(
    values: np.ndarray, lengths: Sequence[int], what: str, of: str, total: int | None = None
) -> None:
    """``values`` holds ``sum(lengths)`` entries (``total``, when the caller has it already)."""
    if total is None:
        total = sum(lengths)
    if values.shape[0] != total:
        raise WireError(
            ReasonCode.LENGTH_MISMATCH,
            f"{what} has {int(values.shape[0])} entries for {total} {of}",
        )


def columns_from_given_rows(
    model: WireModel, name: str, row: type[WireModel], columns: type[RowColumns]
) -> None:
    """In ``model``'s ``__post_init__``: when its field ``name`` was given as a list of ``row``
    structs (how producers and scorers build a group), put their columns there instead.

    Only for Python construction: a frame carries columns (a list there is refused by the
    field's type)."""
    value = getattr(model, name)
    if not isinstance(value, list | tuple):
        return
    if not value:
        raise WireError(ReasonCode.INVALID_FIELD, f"no {name}")
    rows = [item if isinstance(item, row) else msgspec.convert(item, row) for item in value]
    msgspec.structs.force_setattr(model, name, columns.from_rows(rows))  # type: ignore[attr-defined]  # public in msgspec, absent from its stubs
