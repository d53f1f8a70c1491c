"""``checkpointing``: save cadence, top-k retention by metric, format, optimizer state."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from dockyard.config.base import Section


class CheckpointingConfig(Section):
    enabled: bool = True
    checkpoint_dir: str = "results/checkpoints"
    metric_name: str | None = Field("val:accuracy", description="'val:<key>' or 'train:<key>'")
    higher_is_better: bool = True
    keep_top_k: PositiveInt | None = 3
    keep_latest_k: PositiveInt | None = None
    save_period: PositiveInt = 10
    model_save_format: Literal["safetensors", "dcp"] = Field(
        "safetensors", description="dcp = torch distributed checkpoint (for sharded trainers)"
    )
    save_optimizer: bool = True
