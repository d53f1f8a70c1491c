"""``logger``: metrics backends (W&B, TensorBoard, MLflow, SwanLab), GPU monitoring, samples."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat

from dockyard.config.base import Section


class WandbConfig(Section):
    project: str = "dockyard"
    name: str | None = None
    entity: str | None = None
    mode: Literal["online", "offline", "disabled"] = "offline"


class TensorboardConfig(Section):
    flush_secs: PositiveFloat = 10.0


class MlflowConfig(Section):
    experiment_name: str = "dockyard"
    run_name: str | None = None
    tracking_uri: str | None = Field(None, description="None = sqlite file in the run's log dir")


class SwanlabConfig(Section):
    project: str = "dockyard"
    experiment_name: str | None = None
    mode: Literal["cloud", "local", "offline", "disabled"] = "offline"


class GpuMonitoringConfig(Section):
    collection_interval: PositiveFloat = Field(10.0, description="seconds between GPU readings")
    flush_interval: PositiveFloat = Field(
        10.0, description="seconds at least between two flushes of readings into the metrics"
    )


class LoggerConfig(Section):
    log_dir: str | None = Field(
        None,
        description="where metrics.jsonl, progress.png and the trackers' files go; None = the "
        "run directory, a relative path is taken inside the run directory",
    )
    wandb_enabled: bool = False
    tensorboard_enabled: bool = False
    mlflow_enabled: bool = False
    swanlab_enabled: bool = False
    monitor_gpus: bool = Field(False, description="trainer logs gpu/<i>/* via nvidia-smi")
    num_val_samples_to_print: NonNegativeInt = Field(
        0, description="each validation logs its first N answers (validation.sample events)"
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    tensorboard: TensorboardConfig = Field(default_factory=TensorboardConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    swanlab: SwanlabConfig = Field(default_factory=SwanlabConfig)
    gpu_monitoring: GpuMonitoringConfig = Field(default_factory=GpuMonitoringConfig)

    def directory(self, run_dir: Path) -> Path:
        """The metrics directory of a run whose directory is ``run_dir``."""
        return run_dir if self.log_dir is None else run_dir / self.log_dir
