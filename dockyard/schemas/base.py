"""Base classes of the wire types: frozen msgspec Structs that may hold numpy arrays.

A message is a tree of :class:`WireModel` structs. msgspec checks every field's type and its
``Meta`` constraints when it decodes a frame (strictly: no coercion); what a type cannot say —
array dtypes and values, finite floats, lengths that must agree across fields — is checked in
``__post_init__``, which runs both on decode and when Python code builds a message. (msgspec
does not check types or ``Meta`` constraints of a struct built in Python: the decoder is where
a message from elsewhere is judged.)
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Annotated, Any, ClassVar

import msgspec
import numpy as np

from dockyard.schemas.arrays import ArrayKind
from dockyard.schemas.errors import ReasonCode, WireError

#: Identifiers that end up in ``Nats-Msg-Id`` and subjects: no spaces, no wildcards. ``\Z``, not
#: ``$``: Python's ``$`` also matches before a trailing newline.
IDENTIFIER_PATTERN = r"^[A-Za-z0-9_.:/@+=-]{1,256}\Z"
#: msgpack integers are 64-bit: every integer field is bounded so that encoding cannot fail.
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
#: ``\Z``, not ``$``: Python's ``$`` also matches before a trailing newline ("3.0\n").
_SCHEMA_VERSION = re.compile(r"\A(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\Z")

#: An integer ≥ 0 (counts, indices, versions, sizes).
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
#: A string that may not be empty.
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


def values_equal(left: Any, right: Any) -> bool:
    """Structural equality that compares arrays by shape and values (not by dtype width:
    token ids narrowed to uint16 on the wire equal the int64 ids they came from)."""
    if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
        if not (isinstance(left, np.ndarray) and isinstance(right, np.ndarray)):
            return False
        if left.shape != right.shape:
            return False
        if left.dtype.kind == "f" or right.dtype.kind == "f":
            return bool(np.array_equal(left, right, equal_nan=True))
        return bool(np.array_equal(left, right))
    if isinstance(left, WireModel):
        return type(left) is type(right) and all(
            values_equal(getattr(left, name), getattr(right, name))
            for name in left.__struct_fields__
        )
    if isinstance(left, list | tuple):
        return (
            isinstance(right, list | tuple)
            and len(left) == len(right)
            and all(values_equal(a, b) for a, b in zip(left, right, strict=True))
        )
    if isinstance(left, dict):
        return (
            isinstance(right, dict)
            and left.keys() == right.keys()
            and all(values_equal(left[key], right[key]) for key in left)
        )
    return bool(left == right)


def check_finite(value: float | None, what: str, minimum: float | None = None) -> None:
    """A finite float (NaN, ±∞: ``non_finite``) at least ``minimum`` (``invalid_field``);
    None passes (an optional field left out). ``what``: the field's name (or dotted path)."""
    if value is None:
        return
    if not math.isfinite(value):
        raise WireError(ReasonCode.NON_FINITE, f"{value} is not finite", field=what)
    if minimum is not None and value < minimum:
        raise WireError(ReasonCode.INVALID_FIELD, f"{value} is below {minimum}", field=what)


def check_finite_all(values: Sequence[float | None], what: str, minimum: float | None) -> None:
    """:func:`check_finite` for every entry of a column (``what.index``): one pass in C for
    a column that passes (the common case), entry by entry only to name a refused one."""
    present: list[float] = values  # type: ignore[assignment]  # a None entry: TypeError below
    try:
        finite = all(map(math.isfinite, present))
    except TypeError:  # a None entry (an optional field left out): the others are checked
        present = [value for value in values if value is not None]
        finite = all(map(math.isfinite, present))
    if finite and (minimum is None or not present or min(present) >= minimum):
        return
    for index, value in enumerate(values):
        check_finite(value, f"{what}.{index}", minimum)


class WireModel(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """A struct that crosses the broker, whole or as part of a message.

    Frozen: a decoded message is a read-only view of the frame, and a stage that adds to a
    message (a scorer) builds a new one (``msgspec.structs.replace``). Unknown keys are
    *ignored* so that a newer minor version of a schema still decodes here (see the
    compatibility rule in the wire-format doc). No reference cycles: ``gc=False``.

    ``FINITE`` names the float fields that must be finite, each with its lower bound (None:
    any finite value).
    """

    FINITE: ClassVar[Mapping[str, float | None]] = {}

    def __post_init__(self) -> None:
        check_fields(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WireModel):
            return NotImplemented
        return values_equal(self, other)

    __hash__ = None  # type: ignore[assignment]  # arrays are not hashable


def check_fields(model: WireModel) -> None:
    """The per-field checks a type cannot express: array fields (converted from lists when
    built in Python) and finite floats."""
    for name, kind in array_fields(type(model)):
        value = getattr(model, name)
        if value is not None:
            checked = kind.check(value, name)
            if checked is not value:
                msgspec.structs.force_setattr(model, name, checked)
    for name, minimum in model.FINITE.items():
        check_finite(getattr(model, name), name, minimum)


@cache
def array_fields(cls: type[WireModel]) -> tuple[tuple[str, ArrayKind], ...]:
    """The array fields of ``cls`` (``Annotated[np.ndarray, KIND]``, optional or not)."""
    found = []
    for info in msgspec.structs.fields(cls):
        kind = _array_kind(info.type)
        if kind is not None:
            found.append((info.name, kind))
    return tuple(found)


@cache
def nested_array_holders(cls: type[WireModel]) -> tuple[str, ...]:
    """The fields of ``cls`` that hold one nested struct with arrays in it (or None)."""
    found = []
    for info in msgspec.structs.fields(cls):
        inner = _without_none(info.type)
        if _array_kind(inner) is not None:
            continue
        if isinstance(inner, type) and issubclass(inner, WireModel) and holds_arrays(inner):
            found.append(info.name)
        elif _mentions_arrays(inner):
            # The encoder finds arrays through these two plans only.
            raise TypeError(f"{cls.__name__}.{info.name}: arrays only directly or one struct deep")
    return tuple(found)


def holds_arrays(cls: type[WireModel]) -> bool:
    return bool(array_fields(cls) or nested_array_holders(cls))


def _without_none(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:
        return next(arg for arg in args if arg is not type(None))
    return annotation


def _array_kind(annotation: Any) -> ArrayKind | None:
    inner = _without_none(annotation)
    if typing.get_origin(inner) is Annotated:
        return next((item for item in inner.__metadata__ if isinstance(item, ArrayKind)), None)
    return None


def _mentions_arrays(annotation: Any) -> bool:
    if annotation is np.ndarray or _array_kind(annotation) is not None:
        return True
    if isinstance(annotation, type) and issubclass(annotation, WireModel):
        return holds_arrays(annotation)
    return any(_mentions_arrays(arg) for arg in typing.get_args(annotation))


class Message(WireModel, frozen=True, gc=False, kw_only=True):
    """A top-level message: one NATS message body. Subclasses set the two ClassVars."""

    SCHEMA_NAME: ClassVar[str]
    #: "MAJOR.MINOR". A MINOR bump only adds optional fields; anything else bumps MAJOR.
    SCHEMA_VERSION: ClassVar[str]

    def message_id(self) -> str:
        """The deterministic ``Nats-Msg-Id``: the same logical message gets the same id."""
        raise NotImplementedError

    @classmethod
    def schema_major(cls) -> int:
        return parse_schema_version(cls.SCHEMA_VERSION)[0]


def parse_schema_version(text: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` → ``(major, minor)``; ValueError for anything else."""
    match = _SCHEMA_VERSION.match(text)
    if match is None:
        raise ValueError(f"schema version {text!r} is not MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))
