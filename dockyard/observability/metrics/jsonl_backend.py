"""``metrics.jsonl``: the always-on backend, one JSON object per ``log_metrics`` call.

Values are written as given (lists and per-worker mappings included), so the file holds the same
full series W&B receives and needs no tracker to read:
``{"step": 3, "time": ..., "metrics": {...}}``.
Hyperparameters go to ``hyperparams.json`` beside it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from dockyard.observability.metrics.base import MetricValue
from dockyard.utils.private_files import write_private_text

METRICS_FILE = "metrics.jsonl"
HYPERPARAMS_FILE = "hyperparams.json"


def _json_default(value: object) -> object:
    # numpy scalars and arrays, without importing numpy here.
    for attribute in ("tolist", "item"):
        if hasattr(value, attribute):
            return getattr(value, attribute)()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class JsonlBackend:
    name = "jsonl"
    accepts_series = True

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / METRICS_FILE
        self.hyperparams_path = log_dir / HYPERPARAMS_FILE
        # Line-buffered append: a crash loses at most the line being written.
        self._file = self.path.open("a", encoding="utf-8", buffering=1)

    def log_metrics(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        record = {"step": step, "time": time.time(), "metrics": dict(metrics)}
        self._file.write(json.dumps(record, default=_json_default, allow_nan=True) + "\n")

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        # The whole config, credentials included: created 0600 before a byte is written.
        write_private_text(
            self.hyperparams_path, json.dumps(params, default=str, indent=2, sort_keys=True)
        )

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
