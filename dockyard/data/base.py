"""The dataset interface: an indexable, deterministic sequence of prompt records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dockyard.config.sections.data import DatasetConfig

# Ground truth and extra scorer data differ per dataset; JSON-like values by nature.
JsonScalar = str | int | float | bool | None


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset, before tokenization."""

    index: int
    prompt: str
    ground_truth: str
    env: str
    agent_name: str = "default"
    extra: dict[str, JsonScalar] = field(default_factory=dict)


class Dataset(Protocol):
    name: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> PromptRecord: ...


class UnknownDatasetError(KeyError):
    """A config names a dataset no builder is registered for."""

    def __str__(self) -> str:
        return str(self.args[0])


DatasetBuilder = Callable[[DatasetConfig, str], Dataset]
_BUILDERS: dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    def decorator(builder: DatasetBuilder) -> DatasetBuilder:
        if name in _BUILDERS:
            raise ValueError(f"dataset {name!r} is already registered")
        _BUILDERS[name] = builder
        return builder

    return decorator


def dataset_names() -> list[str]:
    _import_builtin_datasets()
    return sorted(_BUILDERS)


def build_dataset(config: DatasetConfig, default_env: str) -> Dataset:
    """Build the dataset a ``data.train`` / ``data.validation`` entry names."""
    _import_builtin_datasets()
    builder = _BUILDERS.get(config.name)
    if builder is None:
        raise UnknownDatasetError(
            f"unknown dataset {config.name!r}; registered: {', '.join(sorted(_BUILDERS))}"
        )
    return builder(config, config.env or default_env)


def _import_builtin_datasets() -> None:
    from dockyard.data import arithmetic  # noqa: F401 - registers itself
