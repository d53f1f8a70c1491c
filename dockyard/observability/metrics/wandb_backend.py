"""Weights & Biases: the full per-step series, list-valued and per-worker metrics included.

``logger.wandb.mode`` is passed through: ``offline`` (default; ``wandb sync`` uploads later),
``online``, or ``disabled``. Runs live in ``<log_dir>/wandb/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dockyard.config.sections.logger import WandbConfig
from dockyard.observability.metrics.base import MetricValue, import_backend_package


class WandbBackend:
    name = "wandb"
    accepts_series = True

    def __init__(self, config: WandbConfig, log_dir: Path) -> None:
        wandb = import_backend_package("wandb", backend="wandb", package="wandb")
        self._wandb = wandb
        log_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=config.project,
            name=config.name,
            entity=config.entity,
            mode=config.mode,
            dir=str(log_dir),
            # A trainer may build more than one logger per process (tests, sweeps).
            reinit="create_new",
            # dockyard's own structured logs own the console; do not wrap stdout/stderr.
            settings=wandb.Settings(console="off"),
        )

    @property
    def run_dir(self) -> Path:
        return Path(self._run.dir).parent

    def log_metrics(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        self._run.config.update(dict(params))

    def close(self) -> None:
        self._run.finish()
        # finish() returns once the run is marked done, but wandb-core may still be writing the
        # offline transaction log (seen under load: a header-only .wandb file right after
        # finish). Tearing the service down waits for it to flush and exit; the next run in
        # this process starts a fresh one.
        self._wandb.teardown()
