"""Metrics loggers: a fan-out over ``metrics.jsonl`` and W&B, TensorBoard, MLflow, SwanLab."""

from dockyard.observability.metrics.base import (
    MetricsLoggerError,
    MetricValue,
    MetricValueError,
    MissingBackendPackageError,
    StepOrderError,
)
from dockyard.observability.metrics.fanout import (
    MetricsLogger,
    check_backend_packages,
    enabled_backends,
)

__all__ = [
    "MetricValue",
    "MetricValueError",
    "MetricsLogger",
    "MetricsLoggerError",
    "MissingBackendPackageError",
    "StepOrderError",
    "check_backend_packages",
    "enabled_backends",
]
