"""Reduce list-valued metrics to a bounded set of scalars for scalar-only backends.

A list becomes ``<name>/mean``, ``/p50``, ``/p90``, ``/max``. A per-worker mapping (such as the
generation timeline, worker id -> per-request durations) is first merged across workers, so one
metric always yields those four keys no matter how many workers or requests there were.
Percentiles use linear interpolation between closest ranks (numpy's default), so
``[1, 2, 3, 4]`` gives p50 = 2.5 and p90 = 3.7.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from dockyard.observability.metrics.base import MetricValue, MetricValueError, Scalar

SUMMARY_SUFFIXES = ("mean", "p50", "p90", "max")

_MLFLOW_FORBIDDEN = re.compile(r"[^A-Za-z0-9_\-. :/]")


def is_scalar(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating)


def as_series(name: str, value: object) -> list[float]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        raise MetricValueError(f"metric {name!r}: expected a list of numbers, got {value!r}")
    series: list[float] = []
    for element in value:
        if not is_scalar(element):
            raise MetricValueError(f"metric {name!r}: list element {element!r} is not a number")
        series.append(float(element))
    return series


def merge_per_worker(name: str, per_worker: Mapping[str, object]) -> list[float]:
    """Concatenate every worker's series (in sorted worker order: a deterministic merge)."""
    merged: list[float] = []
    for worker_id in sorted(per_worker, key=str):
        merged.extend(as_series(f"{name}[{worker_id}]", per_worker[worker_id]))
    return merged


def summarize_series(series: Sequence[float]) -> dict[str, float]:
    """mean / p50 / p90 / max of a non-empty series."""
    values = np.asarray(series, dtype=np.float64)
    return {
        "mean": float(values.mean()),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "max": float(values.max()),
    }


def validate_metric(name: str, value: object) -> MetricValue:
    """Check one metric's shape once, before any backend sees it."""
    if isinstance(value, bool) or is_scalar(value):
        return value  # type: ignore[return-value]  # is_scalar checked it
    if isinstance(value, Mapping):
        merge_per_worker(name, value)
        return value
    as_series(name, value)
    return value  # type: ignore[return-value]  # as_series checked it is a series


def to_scalars(metrics: Mapping[str, MetricValue]) -> dict[str, Scalar]:
    """Scalars pass through; lists and per-worker mappings become their four summary keys.

    An empty list has no statistics, so it contributes no scalar keys (the full-series backends
    and ``metrics.jsonl`` still record it as an empty list).
    """
    scalars: dict[str, Scalar] = {}
    for name, value in metrics.items():
        if isinstance(value, bool):
            scalars[name] = int(value)
            continue
        if is_scalar(value):
            scalars[name] = float(value) if isinstance(value, np.floating) else value  # type: ignore[assignment]  # is_scalar: an int or a float
            continue
        if isinstance(value, Mapping):
            series = merge_per_worker(name, value)
        else:
            series = as_series(name, value)
        if series:
            for suffix, statistic in summarize_series(series).items():
                scalars[f"{name}/{suffix}"] = statistic
    return scalars


def sanitize_mlflow_name(name: str) -> str:
    """MLflow accepts letters, digits and ``_ - . space : /`` in metric and param names."""
    return _MLFLOW_FORBIDDEN.sub("_", name)


def flatten_config(config: Mapping[str, object], parent: str = "") -> dict[str, object]:
    """Nested config -> ``{"policy.model_name": ..., ...}`` (lists are kept as leaf values)."""
    flat: dict[str, object] = {}
    for key, value in config.items():
        path = f"{parent}.{key}" if parent else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, path))
        else:
            flat[path] = value
    return flat
