"""``data``: datasets and dataloaders."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from dockyard.config.base import Section


class DatasetConfig(Section):
    name: str = Field(description="dataset name in the dataset registry, or a file path")
    split: str = "train"
    path: str | None = None
    env: str | None = Field(None, description="environment scoring this data; None = default_env")
    processor: str | None = Field(None, description="None = data.default_processor")
    max_samples: PositiveInt | None = None
    # Dataset-specific generator parameters (e.g. operand ranges): free-form by nature.
    params: dict[str, int | float | str | bool] = Field(default_factory=dict)


class DataConfig(Section):
    train: DatasetConfig
    validation: DatasetConfig | None = None
    extra_train_dataloaders: list[DatasetConfig] = Field(
        default_factory=list, description="more than zero means multiple dataloaders"
    )
    max_input_seq_length: PositiveInt | None = None
    shuffle: bool = True
    default_processor: str = "default"
    default_env: str = "math"
    system_prompt: str | None = None
