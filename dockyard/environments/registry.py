"""Environments by name: adding one is one class with ``@register_environment``."""

from __future__ import annotations

import importlib
from typing import TypeVar

from dockyard.environments.base import Environment, EnvironmentContext

_REGISTRY: dict[str, type[Environment]] = {}
_EnvironmentClass = TypeVar("_EnvironmentClass", bound=type[Environment])

# Built-in environments register on import; importing them lazily keeps torch (teacher) and
# httpx (swe) out of processes that never score with them.
_BUILTIN_MODULES = {
    "math": "dockyard.environments.math_env",
    "arithmetic": "dockyard.environments.arithmetic_env",
    "code": "dockyard.environments.code_env",
    "swe": "dockyard.environments.swe.environment",
    "teacher": "dockyard.environments.teacher_env",
    "reasoning_gym": "dockyard.environments.reasoning_gym_env",
    "gpqa": "dockyard.environments.choice_env",
    "hle": "dockyard.environments.hle_env",
    "program_bench": "dockyard.environments.program_bench_env",
    "terminal_bench": "dockyard.environments.terminal_bench_env",
    "gdpval": "dockyard.environments.gdpval_env",
    "osworld": "dockyard.environments.osworld.environment",
}


class UnknownEnvironmentError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register_environment(cls: _EnvironmentClass) -> _EnvironmentClass:
    name = cls.name
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"environment {name!r} is already registered by {existing.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def environment_class(name: str) -> type[Environment]:
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_environments())
        raise UnknownEnvironmentError(f"unknown environment {name!r} (known: {known})") from None


def available_environments() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES))


def build_environment(name: str, context: EnvironmentContext | None = None) -> Environment:
    """The environment ``name`` built from its typed settings in ``context`` (defaults if None)."""
    return environment_class(name).from_context(context or EnvironmentContext())
