"""Per-model plans of the fields the codec's passes must visit: arrays, nested models, enums.

Both per-message passes of the codec — laying out arrays on encode (``layout``) and resolving
and checking them on decode (``precheck``) — walk a message along its models' fields. The plan
of a model class is computed once from its pydantic fields, so the walks touch only the fields
that can hold an array (directly or in a nested model) and never call into pydantic.
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Union

from dockyard.schemas.arrays import ArrayKind
from dockyard.schemas.base import WireModel


@dataclass(frozen=True, slots=True)
class WirePlan:
    field_names: tuple[str, ...]
    #: Array fields (``None`` allowed where the field is optional) and their kind.
    arrays: tuple[tuple[str, ArrayKind], ...]
    #: Fields holding one nested model (or ``None``).
    models: tuple[tuple[str, type[WireModel]], ...]
    #: Fields holding a list of nested models.
    model_lists: tuple[tuple[str, type[WireModel]], ...]
    #: Enum fields: written as their value.
    enums: tuple[str, ...]

    #: No field needs converting: the model's values are already wire values.
    plain: bool
    #: The subsets of ``models`` and ``model_lists`` whose models can hold arrays.
    array_models: tuple[tuple[str, type[WireModel]], ...]
    array_model_lists: tuple[tuple[str, type[WireModel]], ...]

    #: The nested models (and lists of them) the encoder converts itself; the others are
    #: plain and packed as they are (``layout.pack_plain_model``).
    converted_models: tuple[tuple[str, type[WireModel]], ...]
    converted_model_lists: tuple[tuple[str, type[WireModel]], ...]


def _without_none(annotation: Any) -> Any:
    """``X | None`` → ``X``; anything else unchanged."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _array_kind(annotation: Any, metadata: list[Any]) -> ArrayKind | None:
    for item in metadata:
        if isinstance(item, ArrayKind):
            return item
    if typing.get_origin(annotation) is typing.Annotated:
        return _array_kind(None, list(annotation.__metadata__))
    return None


def mentions_wire_types(annotation: Any) -> bool:
    """``annotation`` names a wire model or an array field somewhere inside."""
    if isinstance(annotation, type) and issubclass(annotation, WireModel):
        return True
    if typing.get_origin(annotation) is typing.Annotated and _array_kind(annotation, []):
        return True
    return any(mentions_wire_types(arg) for arg in typing.get_args(annotation))


@cache
def plan_of(cls: type[WireModel]) -> WirePlan:
    decorators = cls.__pydantic_decorators__
    if decorators.field_serializers or decorators.model_serializers:
        raise TypeError(f"{cls.__name__}: custom serializers are not supported on the wire")
    arrays: list[tuple[str, ArrayKind]] = []
    models: list[tuple[str, type[WireModel]]] = []
    model_lists: list[tuple[str, type[WireModel]]] = []
    enums: list[str] = []
    for name, info in cls.model_fields.items():
        if info.alias is not None and info.alias != name:
            raise TypeError(f"{cls.__name__}.{name}: field aliases are not supported on the wire")
        annotation = _without_none(info.annotation)
        kind = _array_kind(annotation, list(info.metadata))
        if kind is not None:
            arrays.append((name, kind))
        elif isinstance(annotation, type) and issubclass(annotation, WireModel):
            models.append((name, annotation))
        elif typing.get_origin(annotation) is list and _is_model(typing.get_args(annotation)):
            model_lists.append((name, typing.get_args(annotation)[0]))
        elif isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            enums.append(name)
        elif _is_plain_model_lists(annotation):
            pass  # lists of lists of plain models: msgpack's hook packs the models as maps
        elif mentions_wire_types(annotation):
            raise TypeError(f"{cls.__name__}.{name}: {annotation} is not a supported wire shape")
    return WirePlan(
        field_names=tuple(cls.model_fields),
        arrays=tuple(arrays),
        models=tuple(models),
        model_lists=tuple(model_lists),
        enums=tuple(enums),
        plain=not (arrays or models or model_lists or enums),
        array_models=tuple((n, c) for n, c in models if _holds_arrays(c)),
        array_model_lists=tuple((n, c) for n, c in model_lists if _holds_arrays(c)),
        converted_models=tuple((n, c) for n, c in models if not plan_of(c).plain),
        converted_model_lists=tuple((n, c) for n, c in model_lists if not plan_of(c).plain),
    )


def _holds_arrays(cls: type[WireModel]) -> bool:
    plan = plan_of(cls)
    return bool(plan.arrays or plan.array_models or plan.array_model_lists)


def _is_model(args: tuple[Any, ...]) -> bool:
    return len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], WireModel)


def _is_plain_model_lists(annotation: Any) -> bool:
    """``list[list[M]]`` for a plain model ``M`` (a group's per-sample segments)."""
    if typing.get_origin(annotation) is not list:
        return False
    (inner,) = typing.get_args(annotation) or (None,)
    if typing.get_origin(inner) is not list:
        return False
    args = typing.get_args(inner)
    return _is_model(args) and plan_of(args[0]).plain
