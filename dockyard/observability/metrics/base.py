"""What every metrics backend implements, the metric value types, and the logger's errors."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Protocol

Scalar = float | int
"""A plain number. ``bool`` is accepted too (it is an ``int``) and logged as 0/1."""

Series = Sequence[Scalar]
"""A list-valued metric, e.g. every rollout's length in one step."""

PerWorkerSeries = Mapping[str, Series]
"""One series per worker, e.g. the generation timeline: worker id -> per-request durations (s)."""

MetricValue = Scalar | Series | PerWorkerSeries

LOGGERS_EXTRA_HINT = "pip install 'dockyard[loggers]'"


class MetricsLoggerError(Exception):
    """Base class of the metrics logger's errors."""


class MissingBackendPackageError(MetricsLoggerError, ImportError):
    """An enabled backend's package is not installed; raised when the logger is constructed."""


class StepOrderError(MetricsLoggerError, ValueError):
    """A point was logged with a step lower than one already logged.

    W&B and SwanLab silently drop such points, so the logger refuses them for every backend
    instead (before any backend has written anything for that call).
    """


class MetricValueError(MetricsLoggerError, ValueError):
    """A metric value is not a number, a list of numbers or a per-worker mapping of lists."""


class MetricsBackend(Protocol):
    """One destination of the fan-out logger.

    ``accepts_series`` backends receive list-valued and per-worker metrics as they are; the
    others receive the scalar summary (``<name>/mean``, ``/p50``, ``/p90``, ``/max``).
    """

    name: str
    accepts_series: bool

    def log_metrics(self, metrics: Mapping[str, MetricValue], step: int) -> None: ...

    def log_hyperparams(self, params: Mapping[str, object]) -> None: ...

    def close(self) -> None: ...


def import_backend_package(module: str, *, backend: str, package: str) -> ModuleType:
    """Import a backend's package, or fail with the install hint (called at logger construction)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingBackendPackageError(
            f"logger.{backend}_enabled is true but the '{package}' package is not installed "
            f"({error}); install it with {LOGGERS_EXTRA_HINT} or pip install {package}"
        ) from error
