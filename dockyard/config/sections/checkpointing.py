"""``checkpointing``: save cadence, top-k retention by metric, format, optimizer state."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt

from dockyard.config.base import Section


class CheckpointingConfig(Section):
    enabled: bool = True
    checkpoint_dir: str | None = Field(
        None,
        description="None = <run directory>/checkpoints; a relative path is taken inside the "
        "run directory (each run keeps its own), an absolute one as it is",
    )
    metric_name: str | None = Field("val:accuracy", description="'val:<key>' or 'train:<key>'")
    higher_is_better: bool = True
    keep_top_k: PositiveInt | None = 3
    keep_latest_k: PositiveInt | None = None
    save_period: PositiveInt = 10
    model_save_format: Literal["safetensors", "dcp"] = Field(
        "safetensors", description="dcp = torch distributed checkpoint (for sharded trainers)"
    )
    save_optimizer: bool = True

    def directory(self, run_dir: Path) -> Path:
        """The checkpoint directory of a run whose directory is ``run_dir``."""
        return run_dir / ("checkpoints" if self.checkpoint_dir is None else self.checkpoint_dir)
