"""Hydra dot-notation overrides applied to an OmegaConf tree.

Grammar (parsed by hydra-core's public ``OverridesParser``): ``a.b=1`` set, ``+a.b=1`` add
(error if present), ``++a.b=1`` add or set, ``~a.b`` delete (``~a.b=1`` only if the value is 1),
lists ``[1,2]``, dicts ``{k: v}``, quoted strings, ``null``, and ``${...}`` interpolations.
Nested interpolations must be quoted (``'a=${mul:${b},2}'``): Hydra's grammar does not nest them.

Unlike the reference system, ``a.b=1`` also works when ``a.b`` exists only as a pydantic default of
the typed schema and not in the YAML: a plain set is refused only for keys that neither the YAML
nor the schema knows.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, Node, OmegaConf
from pydantic import BaseModel

from dockyard.config.errors import ConfigError, ConfigIssue
from dockyard.config.schema import is_known_path


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    parser = OverridesParser.create()
    parsed: list[Override] = []
    issues: list[ConfigIssue] = []
    for text in overrides:
        try:
            parsed.append(parser.parse_override(text))
        except HydraException as error:
            # The key path is what comes before '=' (without +, ++ or ~), when there is one.
            key = text.split("=", 1)[0].lstrip("+~").strip() if "=" in text else ""
            issues.append(ConfigIssue(key, f"cannot parse override {text!r}: {error}"))
    if issues:
        raise ConfigError(issues)
    return parsed


_MISSING = object()


def _lookup(cfg: DictConfig, key: str) -> object:
    """The raw node value at ``key`` (no interpolation resolved), or ``_MISSING``."""
    node: object = cfg
    for part in key.split("."):
        if isinstance(node, DictConfig):
            if part not in node.keys():  # noqa: SIM118 - `in` would resolve interpolations
                return _MISSING
            node = node._get_node(part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        else:
            return _MISSING
    return node


def _plain_value(node: object) -> object:
    if isinstance(node, DictConfig | ListConfig):
        return OmegaConf.to_container(node)
    return node._value() if isinstance(node, Node) else node


def _siblings(cfg: DictConfig, schema: type[BaseModel], key: str) -> list[str]:
    parent_key, _, _ = key.rpartition(".")
    names: set[str] = set()
    parent = cfg if not parent_key else _lookup(cfg, parent_key)
    if isinstance(parent, DictConfig):
        names.update(str(k) for k in parent.keys())  # noqa: SIM118 - no resolution
    model: type[BaseModel] | None = schema
    for part in parent_key.split(".") if parent_key else []:
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field else None
        model = next(
            (
                member
                for member in getattr(annotation, "__args__", (annotation,))
                if isinstance(member, type) and issubclass(member, BaseModel)
            ),
            None,
        )
    if model is not None:
        names.update(model.model_fields)
    prefix = f"{parent_key}." if parent_key else ""
    return [f"{prefix}{name}" for name in sorted(names)]


def _suggest(cfg: DictConfig, schema: type[BaseModel], key: str) -> str | None:
    """``key`` with its first unknown segment replaced by the closest known one (a misspelt
    section as well as a misspelt leaf), or None when nothing is close."""
    parts = key.split(".")
    for depth in range(1, len(parts) + 1):
        path = ".".join(parts[:depth])
        if _lookup(cfg, path) is not _MISSING or is_known_path(schema, parts[:depth]):
            continue
        close = difflib.get_close_matches(path, _siblings(cfg, schema, path), n=1, cutoff=0.6)
        if not close:
            return None
        return ".".join([close[0], *parts[depth:]])
    return None


def apply_overrides(cfg: DictConfig, overrides: Sequence[str], schema: type[BaseModel]) -> None:
    """Apply ``overrides`` to ``cfg`` in order; raise :class:`ConfigError` listing every refusal."""
    issues: list[ConfigIssue] = []
    for override in parse_overrides(overrides):
        key = override.key_or_group
        text = override.input_line or key
        current = _lookup(cfg, key)
        exists = current is not _MISSING
        if override.is_delete():
            if not exists:
                issues.append(ConfigIssue(key, f"{text!r}: cannot delete a key that is not set"))
                continue
            expected = override.value()
            if expected is not None and _plain_value(current) != expected:
                issues.append(ConfigIssue(key, f"{text!r}: value is {current}, not {expected!r}"))
                continue
            parent_key, _, leaf = key.rpartition(".")
            parent = cfg if not parent_key else OmegaConf.select(cfg, parent_key)
            del parent[int(leaf) if isinstance(parent, ListConfig) else leaf]
            continue
        if override.is_add() and exists:
            issues.append(
                ConfigIssue(
                    key,
                    f"{text!r}: key is already set; use {key}=... to change it "
                    f"or ++{key}=... to add or change",
                )
            )
            continue
        plain_set = not (override.is_add() or override.is_force_add())
        if plain_set and not exists and not is_known_path(schema, key.split(".")):
            suggestion = _suggest(cfg, schema, key)
            hint = f"; did you mean {suggestion!r}?" if suggestion else ""
            issues.append(
                ConfigIssue(
                    key,
                    f"{text!r}: no such key in the config or its schema "
                    f"(use +{key}=... to add a new key){hint}",
                )
            )
            continue
        OmegaConf.update(cfg, key, override.value(), merge=False, force_add=True)
    if issues:
        raise ConfigError(issues)
