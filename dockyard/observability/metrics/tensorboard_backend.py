"""TensorBoard through ``tensorboardX`` (no torch or TensorFlow needed): scalars only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from dockyard.config.sections.logger import TensorboardConfig
from dockyard.observability.metrics.base import MetricValue, import_backend_package

HYPERPARAMS_TAG = "hyperparams"


class TensorboardBackend:
    name = "tensorboard"
    accepts_series = False

    def __init__(self, config: TensorboardConfig, log_dir: Path) -> None:
        tensorboardx = import_backend_package(
            "tensorboardX", backend="tensorboard", package="tensorboardX"
        )
        log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = tensorboardx.SummaryWriter(
            logdir=str(log_dir), flush_secs=int(max(1, config.flush_secs))
        )

    def log_metrics(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, float(value), global_step=step)  # type: ignore[arg-type]  # scalars only reach this backend

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        # The resolved config as one text summary: the hparams plugin wants flat scalars and a
        # metric list up front, which a nested training config is not.
        text = json.dumps(params, default=str, indent=2, sort_keys=True)
        self._writer.add_text(HYPERPARAMS_TAG, f"```json\n{text}\n```", global_step=0)

    def close(self) -> None:
        self._writer.close()
