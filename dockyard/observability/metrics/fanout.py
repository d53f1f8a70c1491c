"""The fan-out metrics logger: one object the trainer talks to, any mix of trackers behind it.

Layout of a run's log dir::

    <log_dir>/metrics.jsonl        always (full values, one JSON object per log call)
    <log_dir>/generation_timeline.jsonl  always (the raw generation intervals, one line per step)
    <log_dir>/hyperparams.json     always (the resolved config, once)
    <log_dir>/wandb/               logger.wandb_enabled
    <log_dir>/tensorboard/         logger.tensorboard_enabled
    <log_dir>/mlflow/              logger.mlflow_enabled (mlflow.db + artifacts/ by default)
    <log_dir>/swanlab/             logger.swanlab_enabled

Rules the logger enforces for every backend alike:

- Every enabled backend's package is imported when the logger is constructed, before any backend
  starts, so a missing package fails at launch with the install hint, never mid-run.
- Steps never go backwards: a step lower than the last one logged raises :class:`StepOrderError`
  (W&B and SwanLab would silently drop the point). Equal steps are fine (several calls per step).
  A late result from an earlier step (e.g. a rollout generated with an older weight version) is
  logged at the current step with its origin as a metric of its own (``rollout/weight_version``).
- Values are checked once, before any backend writes, so a bad value leaves no backend half-written.
- Series backends (W&B, JSONL) get values as given; scalar backends (TensorBoard, MLflow, SwanLab)
  get the bounded summary from :func:`dockyard.observability.metrics.summarize.to_scalars`.
- Hyperparameters are logged once; a second call is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel

from dockyard.config.sections.logger import LoggerConfig
from dockyard.observability.metrics.base import (
    MetricsBackend,
    MetricsLoggerError,
    MetricValue,
    StepOrderError,
    import_backend_package,
)
from dockyard.observability.metrics.jsonl_backend import JsonlBackend
from dockyard.observability.metrics.redaction import redact_secrets
from dockyard.observability.metrics.summarize import to_scalars, validate_metric
from dockyard.observability.metrics.timeline import (
    Timeline,
    TimelineFile,
    summarize_timeline,
    validate_timeline,
)
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class _BackendSpec:
    name: str
    # (module to import, distribution to install) checked before anything starts.
    required: tuple[tuple[str, str], ...]
    build: Callable[[LoggerConfig, Path], MetricsBackend]


def _wandb(config: LoggerConfig, log_dir: Path) -> MetricsBackend:
    from dockyard.observability.metrics.wandb_backend import WandbBackend

    return WandbBackend(config.wandb, log_dir)


def _tensorboard(config: LoggerConfig, log_dir: Path) -> MetricsBackend:
    from dockyard.observability.metrics.tensorboard_backend import TensorboardBackend

    return TensorboardBackend(config.tensorboard, log_dir)


def _mlflow(config: LoggerConfig, log_dir: Path) -> MetricsBackend:
    from dockyard.observability.metrics.mlflow_backend import MlflowBackend

    return MlflowBackend(config.mlflow, log_dir)


def _swanlab(config: LoggerConfig, log_dir: Path) -> MetricsBackend:
    from dockyard.observability.metrics.swanlab_backend import SwanlabBackend

    return SwanlabBackend(config.swanlab, log_dir)


_BACKENDS: tuple[_BackendSpec, ...] = (
    _BackendSpec("wandb", (("wandb", "wandb"),), _wandb),
    _BackendSpec("tensorboard", (("tensorboardX", "tensorboardX"),), _tensorboard),
    _BackendSpec(
        "mlflow",
        (("mlflow", "mlflow-skinny"), ("sqlalchemy", "sqlalchemy"), ("alembic", "alembic")),
        _mlflow,
    ),
    _BackendSpec("swanlab", (("swanlab", "swanlab"),), _swanlab),
)


def enabled_backends(config: LoggerConfig) -> list[str]:
    return [spec.name for spec in _BACKENDS if getattr(config, f"{spec.name}_enabled")]


def check_backend_packages(config: LoggerConfig) -> None:
    """Raise :class:`MissingBackendPackageError` for the first enabled backend not installed."""
    for spec in _BACKENDS:
        if getattr(config, f"{spec.name}_enabled"):
            for module, package in spec.required:
                import_backend_package(module, backend=spec.name, package=package)


class MetricsLogger:
    """Forward metrics and hyperparameters to ``metrics.jsonl`` and every enabled tracker.

    ``log_dir`` overrides ``config.log_dir`` (the trainer passes its run directory).
    """

    def __init__(self, config: LoggerConfig, log_dir: str | Path | None = None) -> None:
        directory = log_dir if log_dir is not None else config.log_dir
        if directory is None:
            raise ValueError("metrics need a log directory: pass log_dir or set logger.log_dir")
        self.log_dir = Path(directory)
        check_backend_packages(config)
        self._backends: list[MetricsBackend] = []
        self._last_step: int | None = None
        self._last_timeline_step: int | None = None
        self._timeline: TimelineFile | None = None
        self._hyperparams_logged = False
        self._closed = False
        try:
            self._backends.append(JsonlBackend(self.log_dir))
            self._timeline = TimelineFile(self.log_dir)
            for spec in _BACKENDS:
                if getattr(config, f"{spec.name}_enabled"):
                    self._backends.append(spec.build(config, self.log_dir / spec.name))
        except BaseException:
            self._close_backends()
            raise
        log.info("metrics logger started", log_dir=str(self.log_dir), backends=self.backend_names)

    @property
    def backend_names(self) -> list[str]:
        return [backend.name for backend in self._backends]

    @property
    def last_step(self) -> int | None:
        return self._last_step

    def log_metrics(
        self, metrics: Mapping[str, MetricValue], step: int, prefix: str | None = None
    ) -> None:
        """Log one step's metrics; ``prefix="train"`` turns ``loss`` into ``train/loss``."""
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise StepOrderError(f"step must be a non-negative int, got {step!r}")
        if self._last_step is not None and step < self._last_step:
            raise StepOrderError(
                f"step {step} is lower than the last logged step {self._last_step} "
                f"(metrics {sorted(metrics)[:5]}); steps must not go backwards"
            )
        named = {
            (f"{prefix}/{name}" if prefix else name): validate_metric(name, value)
            for name, value in metrics.items()
        }
        scalars = to_scalars(named)
        self._last_step = step
        failures: list[str] = []
        for backend in self._backends:
            try:
                backend.log_metrics(named if backend.accepts_series else scalars, step)
            except Exception as error:  # one tracker failing must not starve the others
                log.error("metrics backend failed", backend=backend.name, error=repr(error))
                failures.append(f"{backend.name}: {error!r}")
        if failures:
            raise MetricsLoggerError(f"step {step}: backends failed: {'; '.join(failures)}")

    def log_generation_timeline(self, timeline: Timeline, step: int) -> dict[str, float]:
        """Append the step's raw generation intervals to ``generation_timeline.jsonl`` and
        return their bounded summary, for the caller to log with the step's other metrics
        (so ``metrics.jsonl`` keeps one line per step and no series of hundreds of values)."""
        self._check_open()
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise StepOrderError(f"step must be a non-negative int, got {step!r}")
        if self._last_timeline_step is not None and step <= self._last_timeline_step:
            raise StepOrderError(
                f"generation timeline for step {step} after step {self._last_timeline_step}: "
                "one timeline per step, in order"
            )
        checked = validate_timeline(timeline)
        summary = summarize_timeline(checked)
        if self._timeline is None:  # unreachable once constructed; keeps the type narrow
            raise MetricsLoggerError("the generation timeline file is not open")
        self._timeline.write(step, checked)
        self._last_timeline_step = step
        return summary

    def log_hyperparams(self, config: Mapping[str, object] | BaseModel) -> None:
        """Log the resolved config once, to every backend: whole to ``hyperparams.json`` (the
        run directory is private and a retrain reads it), without secrets to the trackers."""
        self._check_open()
        if self._hyperparams_logged:
            raise MetricsLoggerError("hyperparameters were already logged for this run")
        params = config.model_dump(mode="json") if isinstance(config, BaseModel) else dict(config)
        redacted = redact_secrets(params)
        self._hyperparams_logged = True
        for backend in self._backends:
            backend.log_hyperparams(params if isinstance(backend, JsonlBackend) else redacted)

    def close(self) -> None:
        """Finish every backend's run (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._close_backends()

    def _close_backends(self) -> None:
        errors: list[str] = []
        if self._timeline is not None:
            self._timeline.close()
        for backend in reversed(self._backends):
            try:
                backend.close()
            except Exception as error:  # close the others regardless
                errors.append(f"{backend.name}: {error!r}")
        if errors:
            raise MetricsLoggerError(f"closing backends failed: {'; '.join(errors)}")

    def _check_open(self) -> None:
        if self._closed:
            raise MetricsLoggerError("the metrics logger is closed")

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
