"""SwanLab: scalars only (its ``log`` accepts numbers and media, not lists).

``logger.swanlab.mode`` is passed through: ``offline`` (default; ``swanlab sync`` uploads later),
``local``, ``cloud`` (SwanLab's online mode) or ``disabled``. Runs live in ``<log_dir>/swanlab/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dockyard.config.sections.logger import SwanlabConfig
from dockyard.observability.metrics.base import MetricValue, import_backend_package

# dockyard's config says "cloud" where SwanLab's API says "online".
_SWANLAB_MODE = {"cloud": "online", "local": "local", "offline": "offline", "disabled": "disabled"}


class SwanlabBackend:
    name = "swanlab"
    accepts_series = False

    def __init__(self, config: SwanlabConfig, log_dir: Path) -> None:
        swanlab = import_backend_package("swanlab", backend="swanlab", package="swanlab")
        log_dir.mkdir(parents=True, exist_ok=True)
        self._run = swanlab.init(
            project=config.project,
            name=config.experiment_name,
            mode=_SWANLAB_MODE[config.mode],
            log_dir=str(log_dir),
            reinit=True,
        )
        self._closed = False

    def log_metrics(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        self._run.config.update(dict(params))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._run.finish()
