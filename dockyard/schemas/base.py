"""Base classes of the wire models: immutable pydantic models that may hold numpy arrays."""

from __future__ import annotations

import re
from typing import Any, ClassVar, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

#: Identifiers that end up in ``Nats-Msg-Id`` and subjects: no spaces, no wildcards.
IDENTIFIER_PATTERN = r"^[A-Za-z0-9_.:/@+=-]{1,256}$"
#: msgpack integers are 64-bit: every integer field is bounded so that encoding cannot fail.
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
#: Marks a field validator that leaves every value a frame can carry unchanged: it converts
#: what Python code passes (a list of row models), which a decoded frame never holds. The
#: compiled reader (``compiled``) may then skip it; any other field validator rules it out.
FRAME_INERT = "__dockyard_frame_inert__"
#: Marks the ``BeforeValidator`` function of a ``str`` enum field that only looks a value up
#: among the enum's values (anything else refused): what msgspec does itself when it decodes
#: the enum, so the compiled reader (``compiled``) decodes such a field natively.
STR_ENUM_LOOKUP = "__dockyard_str_enum_lookup__"
#: ``\Z``, not ``$``: Python's ``$`` also matches before a trailing newline ("3.0\n").
_SCHEMA_VERSION = re.compile(r"\A(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})\Z")


_F = TypeVar("_F")


def frame_inert(func: _F) -> _F:
    """Decorator, under ``field_validator`` and ``classmethod``, of a :data:`FRAME_INERT`
    validator."""
    setattr(func, FRAME_INERT, True)
    return func


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
            for name in type(left).model_fields
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


class WireModel(BaseModel):
    """A model that crosses the broker, whole or as part of a message.

    Frozen: a decoded message is a read-only view of the frame, and a stage that adds to a
    message (a scorer) builds a new one. Unknown keys are *ignored* so that a newer minor
    version of a schema still decodes here (see the compatibility rule in the wire-format doc).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        arbitrary_types_allowed=True,
        validate_default=False,
    )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WireModel):
            return NotImplemented
        return values_equal(self, other)

    __hash__ = None  # type: ignore[assignment]  # arrays are not hashable


class Message(WireModel):
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
