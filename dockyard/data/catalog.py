"""What a config's dataset section can name: the built-in datasets (which register themselves
when their modules are imported, here), other registered builders, and local files (``path``).

This is the top of the data package: it imports the dataset modules, and they import only
:mod:`dockyard.data.base`, so the registry never imports its entries back.
"""

from __future__ import annotations

import dataclasses

from dockyard.config.sections.data import DatasetConfig
from dockyard.data import arithmetic, digit_tasks, procedural  # noqa: F401 - built-ins register themselves
from dockyard.data.base import (
    Dataset,
    DatasetError,
    MappedDataset,
    UnknownDatasetError,
    builder_for,
    registered_names,
)
from dockyard.data.files import load_file_dataset
from dockyard.data.processors import DEFAULT_PROCESSOR, process_dataset


def dataset_names() -> list[str]:
    """Every dataset name a config can give (the built-ins are registered by now)."""
    return registered_names()


def build_dataset(
    config: DatasetConfig, default_env: str, default_processor: str = DEFAULT_PROCESSOR
) -> Dataset:
    """Build the dataset a ``data.train`` / ``data.validation`` entry names: the local files at
    ``path`` when it is set, else the registered builder of ``name``; with ``agent_name``, its
    records carry that agent name; then its processor (``processor``, else
    ``default_processor``: ``data.default_processor``)."""
    return process_dataset(_records_of(config, default_env), config.processor or default_processor)


def _records_of(config: DatasetConfig, default_env: str) -> Dataset:
    dataset = _build(config, default_env)
    agent = config.agent_name
    if agent is None:
        return dataset
    return MappedDataset(dataset, lambda record: dataclasses.replace(record, agent_name=agent))


def _build(config: DatasetConfig, default_env: str) -> Dataset:
    env = config.env or default_env
    builder = builder_for(config.name)
    if config.path is not None:
        if builder is not None:
            raise DatasetError(
                "path",
                f"{config.name!r} is a built-in dataset, which reads no path: name a file "
                "dataset something else, or drop path",
            )
        return load_file_dataset(config, env)
    # Compared with the default, not "was it given": a resolved config written out in full
    # (dockyard run hands its roles one) names every key, defaults included.
    if config.fields != type(config).model_fields["fields"].get_default(call_default_factory=True):
        raise DatasetError("fields", "a field mapping applies to file datasets (path) only")
    if builder is None:
        raise UnknownDatasetError(
            f"unknown dataset {config.name!r}; registered: {', '.join(registered_names())} "
            "(or set path to read local files)"
        )
    return builder(config, env)
