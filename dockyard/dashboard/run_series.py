"""The charts' series, read from a run's ``metrics.jsonl`` as it grows.

The file is followed from where the last read stopped (a long run's file is not parsed again on
every refresh); only complete lines are read. A line that is not a metrics record is reported
with its line number, never skipped silently.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.observability.metrics.jsonl_backend import METRICS_FILE

#: The charted series: the name on the page and the metrics key it reads.
CHARTED = {
    "reward": "train/reward_mean",
    "val_accuracy": "val/accuracy",
    "loss": "loss/loss",
    "tokens_per_s": "train/tokens_per_s",
    "staleness_mean": "staleness/mean",
}
#: The trainer's time of one step: waiting for scored data, training, publishing the weights.
#: Its idle fraction is the waiting part of the three.
_WAIT, _BUSY = "timing/wait_for_data_s", ("timing/train_step_s", "timing/publish_weights_s")
_AGE = re.compile(r"^staleness/samples_at_age_(\d+)$")


@dataclass
class RunSeries:
    series: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    #: Samples trained at each staleness (weight versions behind), summed over the run.
    staleness_histogram: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    problems: list[str] = field(default_factory=list)
    records: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "records": self.records,
            "series": {name: [list(p) for p in points] for name, points in self.series.items()},
            "staleness_histogram": [
                {"age": age, "samples": self.staleness_histogram[age]}
                for age in sorted(self.staleness_histogram)
            ],
            "problems": self.problems,
        }


def idle_fraction(metrics: dict[str, object]) -> float | None:
    """wait / (wait + train + publish) of one step, or None when the step does not say."""
    parts = [metrics.get(_WAIT), *(metrics.get(key) for key in _BUSY)]
    if not all(isinstance(p, int | float) and math.isfinite(p) and p >= 0 for p in parts):
        return None
    total = sum(parts)  # type: ignore[arg-type]  # checked just above: finite numbers
    return parts[0] / total if total > 0 else None  # type: ignore[operator]  # checked just above: finite numbers


class MetricsFollower:
    """Reads the records ``metrics.jsonl`` gained since the last call into one
    :class:`RunSeries`."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / METRICS_FILE
        self.state = RunSeries()
        self._offset = 0
        self._line = 0

    def read(self) -> RunSeries:
        if not self.path.exists():
            return self.state
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits
        self._offset += len(complete)
        for raw in complete.splitlines():
            self._line += 1
            self._add(raw)
        return self.state

    def _add(self, raw: bytes) -> None:
        try:
            record = json.loads(raw)
            step, metrics = record["step"], record["metrics"]
            if not isinstance(step, int) or not isinstance(metrics, dict):
                raise TypeError("step must be an integer and metrics a map")
        except (ValueError, KeyError, TypeError) as error:
            self.state.problems.append(f"{self.path.name} line {self._line}: {error}")
            return
        self.state.records += 1
        for name, key in CHARTED.items():
            value = metrics.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                self.state.series[name].append((step, float(value)))
        idle = idle_fraction(metrics)
        if idle is not None:
            self.state.series["trainer_idle_fraction"].append((step, idle))
        for key, value in metrics.items():
            match = _AGE.match(key)
            if match and isinstance(value, int | float):
                self.state.staleness_histogram[int(match.group(1))] += float(value)
