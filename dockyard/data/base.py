"""The dataset interface: an indexable, deterministic sequence of prompt records."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from dockyard.config.sections.data import DatasetConfig

# Ground truth and extra scorer data differ per dataset; JSON-like values by nature.
JsonScalar = str | int | float | bool | None
# What a record carries to its scorer beyond scalars (a program's test cases): JSON by nature.
JsonValue = JsonScalar | list["JsonValue"] | dict[str, "JsonValue"]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    #: Image content parts before the text: where the prompt shows images (its group's, or an
    #: episode's first screenshot, which the episode fills in: producers/episodes.py).
    images: int = 0


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
    extra: dict[str, JsonValue] = field(default_factory=dict)
    messages: tuple[ChatMessage, ...] = ()
    #: Encoded image files the prompt shows (``fields.images``), before its text.
    images: tuple[bytes, ...] = ()


class Dataset(Protocol):
    @property  # read-only: a wrapper passes its inner dataset's name through
    def name(self) -> str: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> PromptRecord: ...


@dataclass(frozen=True)
class MappedDataset:
    """``inner`` with ``transform`` applied to every record as it is read (same name, same
    length): a rendered prompt, an agent name given by the config."""

    inner: Dataset
    transform: Callable[[PromptRecord], PromptRecord]

    @property
    def name(self) -> str:
        return self.inner.name

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> PromptRecord:
        return self.transform(self.inner[index])


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


def refuse_unknown_params(config: DatasetConfig, known: Collection[str]) -> None:
    """A generator's ``params`` name only what it reads: a misspelt one would silently leave
    its default in place."""
    for key in config.params:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise DatasetError(
                f"params.{key}",
                f"{config.name} takes no parameter {key!r} (it takes {', '.join(sorted(known))})"
                + hint,
            )


DatasetBuilder = Callable[[DatasetConfig, str], Dataset]
_BUILDERS: dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    def decorator(builder: DatasetBuilder) -> DatasetBuilder:
        if name in _BUILDERS:
            raise ValueError(f"dataset {name!r} is already registered")
        _BUILDERS[name] = builder
        return builder

    return decorator


def builder_for(name: str) -> DatasetBuilder | None:
    """The builder of ``name``; a family registers as ``family/*`` and builds ``family/<x>``."""
    if name in _BUILDERS:
        return _BUILDERS[name]
    family, slash, _ = name.partition("/")
    return _BUILDERS.get(f"{family}/*") if slash else None


def registered_names() -> list[str]:
    """The names registered so far (:func:`dockyard.data.catalog.dataset_names` lists them all)."""
    return sorted(_BUILDERS)
