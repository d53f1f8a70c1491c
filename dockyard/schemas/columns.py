"""Struct-of-arrays helpers: the rows of a group (samples, scores) carried field by field.

Schema 3.0 of ``rollout`` and ``scored_rollout`` holds a group's G samples and G scores as
*columns* — one list (or one concatenated array) per field — instead of one model per sample.
Decoding then costs a handful of list and array validations per group, whatever G, and the
trainer reads the arrays it stacks without touching a per-sample object. The row models
(``RolloutSample``, ``SampleScore``) stay the way to build a group and to look at one sample:
a column container builds its rows on first access, from values it has already validated.

This module holds what the containers share: the columns of a *plain* row model (only scalar,
string, list and dict fields — ``SamplingParams``, ``EngineInfo``, ``SampleTimings``), derived
from the row model so that its constraints are defined once; ragged array helpers; and the
"every column has G entries" check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import ValidationInfo, create_model
from pydantic_core import PydanticCustomError

from dockyard.schemas.arrays import CTX_BLOB
from dockyard.schemas.base import WireModel
from dockyard.schemas.errors import ReasonCode
from dockyard.schemas.wire_plan import plan_of


class RowColumns(WireModel):
    """Base of a group's columns (samples, scores), which read as a sequence of row models.

    Subclasses define ``rows`` (a ``cached_property`` building every row once) and ``__len__``.
    The built rows are a cache, not content: equality, the codec and pickling see the columns
    only.
    """

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(self.rows)  # type: ignore[attr-defined]

    def __getitem__(self, index: int) -> Any:
        return self.rows[index]  # type: ignore[attr-defined]

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Any:
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("rows", None)  # ``update`` may have changed what the rows would be
        return copy

    def keep_rows(self, rows: Sequence[Any]) -> None:
        """Remember the rows these columns were built from (what ``rows`` would build)."""
        self.__dict__["rows"] = list(rows)

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state["__dict__"] = {
            name: value for name, value in state["__dict__"].items() if name != "rows"
        }
        return state


def rows_to_columns(
    value: Any,
    info: ValidationInfo,
    row: type[WireModel],
    from_rows: Callable[[list[Any]], RowColumns],
    what: str,
) -> Any:
    """A ``mode="before"`` field validator's body: a list of ``row`` models (how producers and
    scorers build a group) → their columns; anything else is left to the field's own validation.

    Only for Python construction: a frame carries columns, and a list there is refused.
    """
    if not isinstance(value, list | tuple):
        return value
    if info.context and CTX_BLOB in info.context:
        raise PydanticCustomError(
            ReasonCode.WRONG_TYPE.value,
            "{what} must be a map of columns, not a list",
            {"what": what},
        )
    if not value:
        raise PydanticCustomError(ReasonCode.INVALID_FIELD.value, "no {what}", {"what": what})
    rows = [item if isinstance(item, row) else row.model_validate(item) for item in value]
    return from_rows(rows)


class PlainColumns(WireModel):
    """Base of the models :func:`plain_columns` derives: the columns of a plain row model."""

    #: The row model whose fields these columns hold.
    ROW: ClassVar[type[WireModel]]


@cache
def plain_columns(row: type[WireModel]) -> type[PlainColumns]:
    """A model with one list per field of the plain model ``row`` (entry i: row i's value).

    Each list item keeps the field's type and constraints (``Field(ge=0)`` on the row field
    becomes a bound on every entry). A field with a default may be absent (``None``): a frame
    of an older minor version, written before the field existed, means "the default for every
    row". The encoder always writes every column.

    The class is named ``<Row>Columns`` and claims the row's module: bind it to that name there
    (``SamplingParamsColumns = plain_columns(SamplingParams)``) so that pickle finds it.
    """
    plan = plan_of(row)
    if not plan.plain:
        raise TypeError(f"{row.__name__} is not a plain model: its columns must be written out")
    fields: dict[str, Any] = {}
    for name, info in row.model_fields.items():
        item: Any = info.annotation
        if info.metadata:
            item = Annotated[(item, *info.metadata)]  # type: ignore[valid-type]
        if info.is_required():
            fields[name] = (list[item], ...)  # type: ignore[valid-type]
        else:
            fields[name] = (list[item] | None, None)  # type: ignore[valid-type]
    columns = create_model(  # type: ignore[call-overload]
        f"{row.__name__}Columns",
        __base__=PlainColumns,
        __module__=row.__module__,
        __doc__=f"The columns of a list of {row.__name__} (one list per field).",
        **fields,
    )
    columns.ROW = row  # where ``check_counts`` finds the defaults of absent columns
    return columns  # type: ignore[no-any-return]


def columns_from_rows(row: type[WireModel], rows: Sequence[WireModel]) -> dict[str, list[Any]]:
    """The column values of ``rows`` (instances of the plain model ``row``)."""
    return {name: [item.__dict__[name] for item in rows] for name in row.model_fields}


def rows_from_columns(row: type[WireModel], columns: WireModel, count: int) -> list[Any]:
    """``count`` instances of the plain model ``row`` from its validated, complete columns (no
    second validation: every entry passed the row field's own constraints)."""
    values = columns.__dict__
    per_field = [(name, values[name]) for name in row.model_fields]
    return [
        row.model_construct(**{name: column[index] for name, column in per_field})
        for index in range(count)
    ]


def check_counts(columns: WireModel, count: int, what: str) -> None:
    """Every list column of ``columns`` (nested plain columns included) has ``count`` entries.

    A nested plain column left out (``None``: a frame of an older minor, written before that
    field existed) is filled in here with the field's default for every row, so that the
    columns read the same as those of the same rows built in Python. Called from the
    containers' model validators, on a model not yet handed out.
    """
    values = columns.__dict__
    for name in _list_fields(type(columns)):
        value = values[name]
        if value is None and isinstance(columns, PlainColumns):
            values[name] = _defaults(columns.ROW, name, count)
        elif type(value) is list and len(value) != count:
            raise PydanticCustomError(
                ReasonCode.LENGTH_MISMATCH.value,
                "{what}.{name} has {entries} entries for {count} samples",
                {"what": what, "name": name, "entries": len(value), "count": count},
            )
    for name in _nested_columns(type(columns)):
        check_counts(values[name], count, f"{what}.{name}")


def _defaults(row: type[WireModel], name: str, count: int) -> list[Any]:
    info = row.model_fields[name]
    return [info.get_default(call_default_factory=True) for _ in range(count)]


@cache
def _list_fields(cls: type[WireModel]) -> tuple[str, ...]:
    plan = plan_of(cls)
    special = {name for name, _ in plan.arrays} | {name for name, _ in plan.models}
    return tuple(name for name in cls.model_fields if name not in special)


@cache
def _nested_columns(cls: type[WireModel]) -> tuple[str, ...]:
    return tuple(name for name, _ in plan_of(cls).models)


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
        # columns (token ids, weight versions) hold validated non-negative values: uint64 holds
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
        raise PydanticCustomError(
            ReasonCode.LENGTH_MISMATCH.value,
            "{what} has {have} entries for {total} {of}",
            {"what": what, "have": int(values.shape[0]), "total": total, "of": of},
        )
