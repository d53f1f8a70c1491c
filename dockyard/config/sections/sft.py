"""``sft``: the supervised warm-start stage (``sft.yaml``; the quickstart's first stage)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.sections.data import DatasetConfig


class SFTConfig(Section):
    enabled: bool = True
    max_num_steps: NonNegativeInt = 1000
    batch_size: PositiveInt = 64
    lr: PositiveFloat = 1e-5
    loss_on: Literal["response", "all"] = "response"
    val_period: PositiveInt = 100
    stop_at_val_accuracy: float | None = Field(
        None, ge=0.0, le=1.0, description="stop early once dev accuracy reaches this"
    )
    dev_dataset: DatasetConfig | None = Field(
        None, description="data for the early-stop check; None = data.validation"
    )
    seed: int = 0
