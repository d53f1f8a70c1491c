"""The generation timeline: raw intervals to ``generation_timeline.jsonl``, a bounded per-worker
summary into the step's metrics (issue #26: no hundreds of values per step in metrics.jsonl)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dockyard.config.sections.logger import LoggerConfig
from dockyard.observability.metrics import MetricsLogger, MetricValueError, StepOrderError

# w0 ran three requests, two of them overlapping: busy [100, 104] and [106, 107] = 5 s.
# w1 ran one request of 5 s. The step's window is 100 .. 108 = 8 s.
TIMELINE = {
    "w1": [(103.0, 108.0)],
    "w0": [(100.0, 102.0), (101.0, 104.0), (106.0, 107.0)],
}
PREFIX = "timing/generation_timeline"


def test_summary_in_metrics_jsonl_and_raw_intervals_in_their_own_file(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger:
        summary = logger.log_generation_timeline(TIMELINE, step=1)
        logger.log_metrics({"loss": 0.5, **summary}, step=1)
    [line] = (tmp_path / "metrics.jsonl").read_text().splitlines()
    metrics = json.loads(line)["metrics"]
    # Durations w0: 2, 3, 1 s -> mean 2, p50 2, p90 2.8 (linear between ranks), max 3.
    expected = {
        f"{PREFIX}/w0/count": 3.0,
        f"{PREFIX}/w0/busy_fraction": 5 / 8,
        f"{PREFIX}/w0/mean": 2.0,
        f"{PREFIX}/w0/p50": 2.0,
        f"{PREFIX}/w0/p90": 2.8,
        f"{PREFIX}/w0/max": 3.0,
        f"{PREFIX}/w1/count": 1.0,
        f"{PREFIX}/w1/busy_fraction": 5 / 8,
        f"{PREFIX}/w1/mean": 5.0,
        f"{PREFIX}/w1/p50": 5.0,
        f"{PREFIX}/w1/p90": 5.0,
        f"{PREFIX}/w1/max": 5.0,
    }
    assert set(metrics) == {"loss", *expected}
    assert all(math.isclose(metrics[key], value) for key, value in expected.items()), metrics
    assert not any(isinstance(value, list | dict) for value in metrics.values())

    [raw] = [
        json.loads(x) for x in (tmp_path / "generation_timeline.jsonl").read_text().splitlines()
    ]
    assert raw["step"] == 1
    assert raw["workers"] == {
        "w0": {
            "started_at_unix_s": [100.0, 101.0, 106.0],
            "finished_at_unix_s": [102.0, 104.0, 107.0],
        },
        "w1": {"started_at_unix_s": [103.0], "finished_at_unix_s": [108.0]},
    }


def test_a_step_with_no_generation_time_is_not_busy(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger:
        summary = logger.log_generation_timeline({"w0": [(5.0, 5.0)]}, step=0)
    assert summary[f"{PREFIX}/w0/busy_fraction"] == 0.0
    assert summary[f"{PREFIX}/w0/max"] == 0.0


@pytest.mark.parametrize(
    ("timeline", "reason"),
    [
        ({"w0": [(1.0, float("nan"))]}, "not a pair of finite"),
        ({"w0": [(1.0,)]}, "not a pair of finite"),
        ({"": [(1.0, 2.0)]}, "is not a name"),
    ],
)
def test_a_malformed_timeline_is_refused_and_nothing_written(
    tmp_path: Path, timeline: dict, reason: str
) -> None:
    with (
        MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger,
        pytest.raises(MetricValueError, match=reason),
    ):
        logger.log_generation_timeline(timeline, step=0)
    assert (tmp_path / "generation_timeline.jsonl").read_text() == ""


def test_one_timeline_per_step_in_order(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger:
        logger.log_generation_timeline(TIMELINE, step=2)
        with pytest.raises(StepOrderError, match="step 2 after step 2"):
            logger.log_generation_timeline(TIMELINE, step=2)
