"""Metrics loggers: a fan-out over ``metrics.jsonl`` and W&B, TensorBoard, MLflow, SwanLab."""

from dockyard.utils.metrics.base import (
    MetricsLoggerError,
    MetricValue,
    MetricValueError,
    MissingBackendPackageError,
    StepOrderError,
)
from dockyard.utils.metrics.fanout import MetricsLogger, check_backend_packages, enabled_backends

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
