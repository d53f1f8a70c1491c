"""The compiled reader: a message's metadata decoded and validated in one pass of C code.

The reference decode (``codec``) unpacks the metadata map with msgpack into dicts and lists,
then pydantic validates them: two passes over every value, and a Python object for every map
on the way. A small group's metadata is hundreds of small values (a 16-sample group: ≈ 650),
and those passes cost more than its arrays. Here `msgspec <https://jcristharif.com/msgspec/>`_
decodes the packed map straight into *structs* derived from the message's own pydantic models
(same fields, same constraints), then the models are assembled from the struct values without
a second validation, and their model validators run as pydantic would run them.

Soundness: the reader answers with the message or with ``None`` ("not sure"), never with a
refusal; on ``None`` the codec decodes the message the reference way, which accepts or refuses
it with its usual reason. So the reader only has to accept *nothing the reference refuses*, and
give the same message when both accept. Its structs are at least as strict as the pydantic
models (msgspec is strict about types where pydantic's lax mode converts: the reference
path then decides); what msgspec cannot express exactly (a ``pattern``, a JSON value, a custom
validator) is left packed, unpacked by msgpack as the reference path unpacks it, and checked by
pydantic's own validator of that type. Arrays
are resolved and value-checked by the reference pre-pass's own code (``precheck``). Anything
unexpected (an error of any kind, a key the model does not have) is ``None``. Classes the derivation
cannot express completely (custom before-validators) have no compiled reader.
``tests/unit/schemas/test_compiled_reader.py`` checks the two paths against each other on
mutated frames.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Union

import annotated_types
import msgpack
import msgspec
from pydantic import BeforeValidator, ConfigDict, PlainSerializer, PlainValidator, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic.json_schema import WithJsonSchema

from dockyard.schemas.arrays import ArrayKind
from dockyard.schemas.base import FRAME_INERT, STR_ENUM_LOOKUP, WireModel
from dockyard.schemas.envelope import UNPACKING
from dockyard.schemas.limits import DecodeLimits
from dockyard.schemas.precheck import ArrayPrecheck, NotChecked
from dockyard.schemas.wire_plan import mentions_wire_types

__all__ = ["has_compiled_reader", "read_compiled"]


class _Unsupported(Exception):
    """The derivation cannot express this model exactly: the class has no compiled reader."""


#: Convert one decoded value into the model's value; the precheck resolves arrays.
Converter = Callable[[Any, ArrayPrecheck], Any]
_FLOAT_MAX = 1.7976931348623157e308
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_STRICT_NUMBERS = (int, float)
#: The wire is read strictly (no coercion: ``codec._validate``), so are the values pydantic
#: checks for this reader.
_ADAPTER_CONFIG = ConfigDict(arbitrary_types_allowed=True, strict=True)
#: What an array field's ``Annotated`` carries (``arrays._array_type``): the kind says it all.
_ARRAY_MACHINERY = (ArrayKind, PlainValidator, PlainSerializer, WithJsonSchema)


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    convert: Converter | None
    info: FieldInfo


class _ModelReader:
    """The struct type of one model class and how to build the model from an instance."""

    __slots__ = ("build", "struct")

    def __init__(self, cls: type[WireModel]) -> None:
        fields: list[_Field] = []
        struct_fields: list[tuple[Any, ...]] = []
        for name, info in cls.model_fields.items():
            annotation, convert = _translate(info.annotation, list(info.metadata))
            fields.append(_Field(name, convert, info))
            if info.is_required():
                struct_fields.append((name, annotation))
            else:
                struct_fields.append((name, annotation | msgspec.UnsetType, msgspec.UNSET))
        # Unknown keys are refused ("not sure"): msgspec would skip them unchecked, where the
        # reference unpacker refuses an ext type or an int map key anywhere in the map. So a
        # frame of a newer minor version (a field added) is read the reference way.
        # gc=False: decoded values form a tree (no cycles), and tracking every struct of every
        # message costs the collector time for nothing.
        self.struct = msgspec.defstruct(
            f"{cls.__name__}Struct",
            struct_fields,
            kw_only=True,
            forbid_unknown_fields=True,
            gc=False,
        )
        #: ``build(struct, precheck)``: the model from a decoded struct (NotChecked if unsure).
        self.build: Converter = _builder(cls, fields, _after_validators(cls))


def _builder(
    cls: type[WireModel], fields: list[_Field], validators: tuple[Callable[[Any], Any], ...]
) -> Converter:
    """A function that builds ``cls`` from its struct: what ``model_construct`` does (without
    its alias handling: wire models have none), then the model validators.

    Generated as straight-line code, as ``dataclasses`` generates ``__init__``: this runs for
    every model of every decoded message (≈ 20 for a 16-sample group), where a loop over field
    descriptions costs a few lookups per field more. A frame written by this package's encoder
    has every field, so the common case is one dict display of every field's value; only when
    some optional field is absent does the field-by-field path fill in defaults. Only field
    names (identifiers, checked by pydantic) and indexes reach the source text.
    """
    names: dict[str, Any] = {
        "UNSET": msgspec.UNSET,
        "new": cls.__new__,
        "cls": cls,
        "setattr": object.__setattr__,
    }
    # ``every``: each field's value in the dict display; ``general``: the field-by-field path.
    every: list[str] = []
    general: list[str] = []
    optional: list[str] = []
    for index, field in enumerate(fields):
        name = field.name
        if not name.isidentifier():  # pydantic allows none other; the source below relies on it
            raise _Unsupported(f"{cls.__name__}: field name {name!r}")
        value = f"struct.{name}"
        if field.convert is not None:
            names[f"convert_{index}"] = field.convert
            value = f"convert_{index}(struct.{name}, precheck)"
        every.append(f"{name!r}: {value}")
        if field.info.is_required():
            general.append(f"values[{name!r}] = {value}")
        else:
            names[f"default_{index}"] = field.info.get_default
            optional.append(name)
            general += [
                f"if struct.{name} is UNSET:",
                f"    values[{name!r}] = default_{index}("
                "call_default_factory=True, validated_data=values)",
                "else:",
                f"    values[{name!r}] = {value}",
                f"    fields_set.add({name!r})",
            ]
    all_names = ", ".join(repr(field.name) for field in fields)
    required = ", ".join(repr(field.name) for field in fields if field.info.is_required())
    lines = ["def build(struct, precheck):"]
    if optional:
        lines += [
            f"    if {' or '.join(f'struct.{name} is UNSET' for name in optional)}:",
            f"        fields_set = {{{required}}}" if required else "        fields_set = set()",
            "        values = {}",
            *(f"        {line}" for line in general),
            "    else:",
            f"        fields_set = {{{all_names}}}",
            f"        values = {{{', '.join(every)}}}",
        ]
    else:
        lines += [
            f"    fields_set = {{{all_names}}}" if fields else "    fields_set = set()",
            f"    values = {{{', '.join(every)}}}",
        ]
    lines += [
        "    model = new(cls)",
        "    setattr(model, '__dict__', values)",
        "    setattr(model, '__pydantic_fields_set__', fields_set)",
        "    setattr(model, '__pydantic_extra__', None)",
        "    setattr(model, '__pydantic_private__', None)",
    ]
    for index, validator in enumerate(validators):
        names[f"validator_{index}"] = validator
        lines.append(f"    model = validator_{index}(model)")
    lines.append("    return model")
    # A file name of its own per class: profiles tell the readers apart.
    exec(compile("\n".join(lines), f"<compiled reader of {cls.__name__}>", "exec"), names)
    return names["build"]  # type: ignore[no-any-return]


def _after_validators(cls: type[WireModel]) -> tuple[Callable[[Any], Any], ...]:
    decorators = cls.__pydantic_decorators__
    if cls.__pydantic_post_init__ or cls.__private_attributes__:
        raise _Unsupported(f"{cls.__name__}: post-init or private attributes")
    if decorators.root_validators or decorators.validators:
        raise _Unsupported(f"{cls.__name__}: v1-style validators")
    for decorator in decorators.field_validators.values():
        func = getattr(decorator.func, "__func__", decorator.func)
        if not getattr(func, FRAME_INERT, False):
            raise _Unsupported(f"{cls.__name__}.{decorator.cls_var_name}: a field validator")
    validators = []
    for decorator in decorators.model_validators.values():
        if decorator.info.mode != "after":
            raise _Unsupported(f"{cls.__name__}.{decorator.cls_var_name}: not an after validator")
        validators.append(decorator.func)
    return tuple(validators)


# --------------------------------------------------------------------------- type translation


def _translate(annotation: Any, metadata: list[Any]) -> tuple[Any, Converter | None]:
    """The msgspec type of a pydantic type with its constraints (``metadata``), and the
    converter from the decoded value to the model's value (None: the value as decoded)."""
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        return _translate(inner, [*_flatten(extra), *metadata])
    metadata = _flatten(metadata)
    kind = next((item for item in metadata if isinstance(item, ArrayKind)), None)
    if kind is not None:
        if any(type(item) not in _ARRAY_MACHINERY for item in metadata):
            raise _Unsupported(f"{annotation}: an array field with constraints of its own")
        return _array(annotation, kind)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType) and type(None) in args:
        rest = tuple(arg for arg in args if arg is not type(None))
        if len(rest) == 1:
            inner, convert = _translate(rest[0], metadata)
            if _is_python_check(convert):
                return _python_checked(annotation, metadata)
            return inner | None, _or_none(convert)
    if isinstance(annotation, type) and issubclass(annotation, WireModel):
        if metadata:
            return _python_checked(annotation, metadata)
        reader = _model_reader(annotation)
        return reader.struct, reader.build
    if origin is list and len(args) == 1:
        item, convert_item = _translate(args[0], [])
        bounds = _length_bounds(metadata)
        if bounds is None or _is_python_check(convert_item):
            return _python_checked(annotation, metadata)
        return _constrained(list[item], bounds), _each(convert_item)  # type: ignore[valid-type]
    if origin is dict and len(args) == 2 and args[0] is str:
        value, convert_value = _translate(args[1], [])
        bounds = _length_bounds(metadata)
        if bounds is None or _is_python_check(convert_value):
            return _python_checked(annotation, metadata)
        mapping = dict[str, value]  # type: ignore[valid-type]
        return _constrained(mapping, bounds), _each_value(convert_value)
    if annotation is int or annotation is float:
        bounds = _number_bounds(annotation, metadata)
        if bounds is None:
            return _python_checked(annotation, metadata)
        return _constrained(annotation, bounds), None
    if annotation is str or annotation is bytes:
        bounds = _length_bounds(metadata, patterns=annotation is str)
        if bounds is None:
            return _python_checked(annotation, metadata)
        return _constrained(annotation, bounds), None
    if annotation is bool and not metadata:
        return bool, None
    if origin is Literal and not metadata and all(type(arg) is str for arg in args):
        return annotation, None
    if (
        isinstance(annotation, type)
        and issubclass(annotation, enum.Enum)
        and issubclass(annotation, str)
        and all(_is_enum_lookup(item) for item in metadata)
    ):
        return annotation, None  # msgspec: exactly the enum's str values
    return _python_checked(annotation, metadata)


def _is_enum_lookup(item: Any) -> bool:
    return isinstance(item, BeforeValidator) and getattr(item.func, STR_ENUM_LOOKUP, False)


def _flatten(metadata: list[Any]) -> list[Any]:
    """``Field(...)`` inside ``Annotated`` arrives as a FieldInfo: its constraints, in order."""
    flat: list[Any] = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            flat.extend(_flatten(list(item.metadata)))
        else:
            flat.append(item)
    return flat


class _ArrayDescriptor(msgspec.Struct, forbid_unknown_fields=True):
    """An array descriptor as the reference pre-pass (``ArrayPrecheck``) accepts one: exactly
    these keys, a 1-D shape, non-negative integers. Anything else is the reference path's."""

    dtype: str
    shape: typing.Annotated[
        list[typing.Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=1, max_length=1)
    ]
    data: typing.Annotated[
        list[typing.Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(min_length=2, max_length=2)
    ]


def _array(annotation: Any, kind: ArrayKind) -> tuple[Any, Converter]:
    """An array field: its descriptor, checked and resolved by the pre-pass's own code."""

    def resolve(descriptor: _ArrayDescriptor, precheck: ArrayPrecheck) -> Any:
        offset, nbytes = descriptor.data
        arr = precheck.view(descriptor.dtype, descriptor.shape[0], offset, nbytes, kind)
        if arr is None:
            raise NotChecked
        return arr

    return _ArrayDescriptor, resolve


def _python_checked(annotation: Any, metadata: list[Any]) -> tuple[Any, Converter]:
    """A type msgspec cannot express exactly: its packed bytes are unpacked as the reference
    path unpacks them (msgpack, no ext types, str or bin map keys), then validated by pydantic's
    own validator for the type (what the model's field runs)."""
    if mentions_wire_types(annotation):
        raise _Unsupported(f"{annotation}: a model or array inside a type msgspec cannot express")
    adapter = TypeAdapter(
        typing.Annotated[(annotation, *metadata)] if metadata else annotation,  # type: ignore[valid-type]
        config=_ADAPTER_CONFIG,
    )
    validate = adapter.validator.validate_python  # TypeAdapter's wrapper adds a Python call

    def check(packed: msgspec.Raw, precheck: ArrayPrecheck) -> Any:
        # No size limits needed here: the whole meta map is at most as long as the smallest
        # of the reference's msgpack limits (``envelope.scan_envelope``).
        return validate(msgpack.unpackb(packed, **UNPACKING))

    setattr(check, _PYTHON_CHECK, True)
    return msgspec.Raw, check


#: Marks a converter made by ``_python_checked``: a container of such values is checked whole,
#: by one pydantic call, rather than item by item from Python.
_PYTHON_CHECK = "dockyard_python_check"


def _is_python_check(convert: Converter | None) -> bool:
    return getattr(convert, _PYTHON_CHECK, False)


def _constrained(annotation: Any, bounds: dict[str, Any]) -> Any:
    return typing.Annotated[annotation, msgspec.Meta(**bounds)] if bounds else annotation


def _length_bounds(metadata: list[Any], *, patterns: bool = False) -> dict[str, Any] | None:
    """msgspec's length bounds for pydantic's (and, with ``patterns``, a string's pattern);
    None when some constraint is something else."""
    bounds: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, annotated_types.MinLen):
            bounds["min_length"] = max(bounds.get("min_length", 0), item.min_length)
        elif isinstance(item, annotated_types.MaxLen):
            bounds["max_length"] = min(bounds.get("max_length", item.max_length), item.max_length)
        elif patterns and "pattern" not in bounds and vars(item).keys() == {"pattern"}:
            translated = _python_pattern(vars(item)["pattern"])
            if translated is None:
                return None
            bounds["pattern"] = translated
        else:
            return None
    return bounds


#: The patterns whose meaning is the same in pydantic's regex engine (Rust's ``regex``) and in
#: Python's ``re`` (msgspec's) once the closing ``$`` is spelled ``\Z``: anchored runs of
#: character classes of ASCII letters, digits and a few punctuation marks (no escapes, no
#: negation, no ``--``: Rust reads it as a set difference), each with an optional ``{m}`` or
#: ``{m,n}``. The rewrite matters: Python's ``$`` also matches before a trailing newline, Rust's
#: does not.
_PORTABLE_PATTERN = re.compile(r"\^(?:\[[A-Za-z0-9_.:/@+=-]+\](?:\{[0-9]+(?:,[0-9]+)?\})?)+\$")


def _python_pattern(pattern: Any) -> str | None:
    """``pattern`` (pydantic's) as a Python ``re`` pattern that matches exactly the same
    strings, or None when that is not certain."""
    if type(pattern) is not str or "--" in pattern or not _PORTABLE_PATTERN.fullmatch(pattern):
        return None
    return pattern[:-1] + "\\Z"


def _number_bounds(annotation: type, metadata: list[Any]) -> dict[str, Any] | None:
    """msgspec's bounds for pydantic's on an int or float; None for anything else (a
    ``multiple_of``, strictness…). ``allow_inf_nan=False`` becomes finite bounds, which refuse
    NaN too (every comparison with NaN fails)."""
    bounds: dict[str, Any] = {}
    finite = False
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            bounds["ge"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            bounds["gt"] = item.gt
        elif isinstance(item, annotated_types.Le):
            bounds["le"] = item.le
        elif isinstance(item, annotated_types.Lt):
            bounds["lt"] = item.lt
        elif annotation is float and vars(item).keys() == {"allow_inf_nan"}:
            finite = not vars(item)["allow_inf_nan"]
        else:
            return None
    if any(type(bound) not in _STRICT_NUMBERS for bound in bounds.values()):
        return None
    if annotation is int:
        # msgpack holds no integer outside [-2**63, 2**64): bounds at those ends say nothing,
        # and msgspec only takes bounds that fit an int64.
        if bounds.get("le", 0) >= _UINT64_MAX:
            del bounds["le"]
        if bounds.get("ge", 0) <= _INT64_MIN:
            del bounds["ge"]
        if any(not _INT64_MIN <= bound <= _INT64_MAX for bound in bounds.values()):
            return None
    if finite:
        if "ge" not in bounds and "gt" not in bounds:
            bounds["ge"] = -_FLOAT_MAX
        if "le" not in bounds and "lt" not in bounds:
            bounds["le"] = _FLOAT_MAX
    if annotation is float:
        bounds = {name: float(bound) for name, bound in bounds.items()}
    return bounds


def _or_none(convert: Converter | None) -> Converter | None:
    if convert is None:
        return None

    def convert_unless_none(value: Any, precheck: ArrayPrecheck) -> Any:
        return None if value is None else convert(value, precheck)

    return convert_unless_none


def _each(convert: Converter | None) -> Converter | None:
    if convert is None:
        return None
    inner = getattr(convert, _EACH_OF, None)
    if inner is not None:  # a list of lists (a group's segments): one nested comprehension

        def convert_nested(values: list[list[Any]], precheck: ArrayPrecheck) -> list[Any]:
            # Most samples have no segments and no tool calls: no inner comprehension for them.
            return [
                [inner(value, precheck) for value in items] if items else [] for items in values
            ]

        return convert_nested

    def convert_items(values: list[Any], precheck: ArrayPrecheck) -> list[Any]:
        return [convert(value, precheck) for value in values]

    setattr(convert_items, _EACH_OF, convert)
    return convert_items


_EACH_OF = "dockyard_each_of"


def _each_value(convert: Converter | None) -> Converter | None:
    if convert is None:
        return None

    def convert_values(values: dict[str, Any], precheck: ArrayPrecheck) -> dict[str, Any]:
        return {key: convert(value, precheck) for key, value in values.items()}

    return convert_values


# --------------------------------------------------------------------------- reading


@cache
def _model_reader(cls: type[WireModel]) -> _ModelReader:
    return _ModelReader(cls)


@cache
def _decoder(cls: type[WireModel]) -> msgspec.msgpack.Decoder[Any] | None:
    try:
        return msgspec.msgpack.Decoder(_model_reader(cls).struct)
    except (_Unsupported, TypeError, ValueError):  # msgspec refuses a type it cannot decode
        return None


def has_compiled_reader(cls: type[WireModel]) -> bool:
    return _decoder(cls) is not None


def read_compiled(
    cls: type[WireModel], meta: memoryview, blob: memoryview | bytes, limits: DecodeLimits
) -> Any:
    """``cls`` decoded from its packed ``meta`` map and array section ``blob``, or None when
    the compiled reader cannot vouch for it (the codec then decodes it the reference way)."""
    decoder = _decoder(cls)
    if decoder is None:
        return None
    precheck = ArrayPrecheck(blob, limits)
    try:
        message = _model_reader(cls).build(decoder.decode(meta), precheck)
        precheck.check_values()
    except Exception:  # any doubt at all: the reference path decides (and reports)
        return None
    return message
