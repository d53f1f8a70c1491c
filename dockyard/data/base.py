"""The dataset interface: an indexable, deterministic sequence of prompt records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dockyard.config.sections.data import DatasetConfig

# Ground truth and extra scorer data differ per dataset; JSON-like values by nature.
JsonScalar = str | int | float | bool | None


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a dataset, before tokenization.

    ``prompt`` is the text the model is given. A dataset that writes its prompts as a chat
    leaves it empty and sets ``messages``; :mod:`dockyard.data.chat` renders them (with the
    tokenizer's chat template) into ``prompt`` before anything tokenizes it.
    """

    index: int
    prompt: str
    ground_truth: str
    env: str
    agent_name: str = "default"
    extra: dict[str, JsonScalar] = field(default_factory=dict)
    messages: tuple[ChatMessage, ...] = ()


class Dataset(Protocol):
    name: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> PromptRecord: ...


class UnknownDatasetError(KeyError):
    """A config names a dataset no builder is registered for."""

    def __str__(self) -> str:
        return str(self.args[0])


class DatasetError(ValueError):
    """A dataset cannot be built as configured: ``key`` is the offending key's path relative
    to its dataset section (``path``, ``fields.answer``), so a launch refusal can name it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


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
    """Build the dataset a ``data.train`` / ``data.validation`` entry names: the local files at
    ``path`` when it is set, else the registered builder of ``name``."""
    _import_builtin_datasets()
    env = config.env or default_env
    builder = _builder_for(config.name)
    if config.path is not None:
        if builder is not None:
            raise DatasetError(
                "path",
                f"{config.name!r} is a built-in dataset, which reads no path: name a file "
                "dataset something else, or drop path",
            )
        from dockyard.data.files import load_file_dataset

        return load_file_dataset(config, env)
    # Compared with the default, not "was it given": a resolved config written out in full
    # (dockyard run hands its roles one) names every key, defaults included.
    if config.fields != type(config).model_fields["fields"].get_default(call_default_factory=True):
        raise DatasetError("fields", "a field mapping applies to file datasets (path) only")
    if builder is None:
        raise UnknownDatasetError(
            f"unknown dataset {config.name!r}; registered: {', '.join(sorted(_BUILDERS))} "
            "(or set path to read local files)"
        )
    return builder(config, env)


def _builder_for(name: str) -> DatasetBuilder | None:
    """The builder of ``name``; a family registers as ``family/*`` and builds ``family/<x>``."""
    if name in _BUILDERS:
        return _BUILDERS[name]
    family, slash, _ = name.partition("/")
    return _BUILDERS.get(f"{family}/*") if slash else None


def _import_builtin_datasets() -> None:
    from dockyard.data import arithmetic, procedural  # noqa: F401 - register themselves
