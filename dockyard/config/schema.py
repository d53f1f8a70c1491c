"""Walking the typed config schema: which key paths exist, and which given keys are unknown.

Used for two things the plain OmegaConf → pydantic path cannot do:
- an override ``a.b=1`` may set a key that exists only as a pydantic default (not in the YAML);
- a misspelt key inside a typed section is reported with a "did you mean" suggestion instead of
  being silently kept.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel


@dataclass(frozen=True)
class UnknownKey:
    path: str
    suggestion: str | None

    def __str__(self) -> str:
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        return f"unknown key {self.path!r} (kept, but no typed section reads it){hint}"


def _union_members(annotation: object) -> tuple[object, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    return [
        member
        for member in _union_members(annotation)
        if isinstance(member, type) and issubclass(member, BaseModel)
    ]


def _mapping_value_types(annotation: object) -> list[object]:
    """Value annotations of ``dict[str, X]`` members of a (possibly optional) annotation."""
    values = []
    for member in _union_members(annotation):
        origin = typing.get_origin(member)
        if origin in (dict, Mapping, typing.Dict):  # noqa: UP006 - matching, not annotating
            values.append(typing.get_args(member)[1])
    return values


def _is_free_form(annotation: object) -> bool:
    """A field whose value has no fixed keys (a plain dict, a scalar, a list)."""
    return not _models_in(annotation) and not _mapping_value_types(annotation)


def is_known_path(model: type[BaseModel], parts: Sequence[str]) -> bool:
    """True if ``parts`` names a field (or a key inside a free-form dict field) of the schema."""
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    field = model.model_fields.get(head)
    if field is None:
        return False
    return _annotation_has_path(field.annotation, rest)


def _annotation_has_path(annotation: object, parts: Sequence[str]) -> bool:
    if not parts:
        return True
    if any(is_known_path(sub, parts) for sub in _models_in(annotation)):
        return True
    for value_type in _mapping_value_types(annotation):
        # dict[str, X]: any key is fine; the rest must fit X.
        if _annotation_has_path(value_type, parts[1:]) or _is_free_form(value_type):
            return True
    return False


#: How alike (``difflib`` ratio) an unknown key and a field must be to suggest the field.
SUGGESTION_CUTOFF = 0.6


def find_unknown_keys(
    model: type[BaseModel],
    data: Mapping[str, object],
    prefix: str = "",
    *,
    cutoff: float = SUGGESTION_CUTOFF,
) -> list[UnknownKey]:
    """Keys in ``data`` that ``model`` (recursively) does not declare. ``cutoff``: for the keys
    of ``data`` itself (nested sections use :data:`SUGGESTION_CUTOFF`)."""
    found: list[UnknownKey] = []
    names = list(model.model_fields)
    for key, value in data.items():
        path = f"{prefix}{key}"
        field = model.model_fields.get(str(key))
        if field is None:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=cutoff)
            found.append(UnknownKey(path, f"{prefix}{close[0]}" if close else None))
            continue
        found += _unknown_in_value(field.annotation, value, f"{path}.")
    return found


def _unknown_in_value(annotation: object, value: object, prefix: str) -> list[UnknownKey]:
    if isinstance(value, Mapping):
        models = _models_in(annotation)
        if models:
            return find_unknown_keys(models[0], value, prefix)
        found: list[UnknownKey] = []
        for value_type in _mapping_value_types(annotation):
            for key, item in value.items():
                found += _unknown_in_value(value_type, item, f"{prefix}{key}.")
        return found
    if isinstance(value, list):
        found = []
        for member in _union_members(annotation):
            if typing.get_origin(member) is list:
                (item_type,) = typing.get_args(member)
                for index, item in enumerate(value):
                    found += _unknown_in_value(item_type, item, f"{prefix}{index}.")
        return found
    return []


def leaf_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key path the schema defines down to its leaves, ``*`` standing for the keys of a
    mapping of typed sections (``on_policy_distillation.teachers.*.model_name``)."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        models = _models_in(field.annotation)
        value_models = [
            nested
            for value_type in _mapping_value_types(field.annotation)
            for nested in _models_in(value_type)
        ]
        if models:
            for nested in models:
                paths += leaf_paths(nested, f"{path}.")
        elif value_models:
            for nested in value_models:
                paths += leaf_paths(nested, f"{path}.*.")
        else:
            paths.append(path)
    return sorted(set(paths))


def matches(pattern: str, path: str) -> bool:
    """``pattern`` names ``path``: same number of parts, ``*`` standing for any one part."""
    wanted, given = pattern.split("."), path.split(".")
    return len(wanted) == len(given) and all(
        w in ("*", g) for w, g in zip(wanted, given, strict=True)
    )


def set_values(section: BaseModel, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(path, value, schema default)`` of every leaf of a built config, walking only the
    sections that are present (an absent optional section has no keys to speak of)."""
    found: list[tuple[str, object, object]] = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            found += set_values(value, f"{path}.")
        elif (
            isinstance(value, Mapping)
            and value
            and all(isinstance(item, BaseModel) for item in value.values())
        ):
            for key, item in value.items():
                found += set_values(item, f"{path}.{key}.")
        else:
            found.append((path, value, field.get_default(call_default_factory=True)))
    for name, value in (section.model_extra or {}).items():
        if isinstance(value, BaseModel):  # e.g. a registered environment's section under env
            found += set_values(value, f"{prefix}{name}.")
    return found
