"""The dashboard's series from ``metrics.jsonl``: followed as the file grows, a half-written line
left for the next read, a bad line reported with its number (never skipped silently)."""

from __future__ import annotations

import json
from pathlib import Path

from dockyard.dashboard.run_series import MetricsFollower, idle_fraction


def _line(step: int, **metrics: float) -> str:
    return json.dumps({"step": step, "time": 0.0, "metrics": metrics}) + "\n"


def test_the_file_is_followed_and_a_partial_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    follower = MetricsFollower(tmp_path)
    assert follower.read().records == 0  # no file yet
    second = _line(2, **{"train/reward_mean": 0.5})
    path.write_text(_line(1, **{"train/reward_mean": 0.25}) + second[:10])
    assert follower.read().series["reward"] == [(1, 0.25)]
    with path.open("a") as handle:
        handle.write(second[10:])
    assert follower.read().series["reward"] == [(1, 0.25), (2, 0.5)]


def test_a_bad_line_is_reported_with_its_number(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        _line(1, **{"loss/loss": 1.0}) + "not json\n" + '{"step": "x", "metrics": {}}\n'
    )
    state = MetricsFollower(tmp_path).read()
    assert state.records == 1
    assert [p.split(":")[0] for p in state.problems] == [
        "metrics.jsonl line 2",
        "metrics.jsonl line 3",
    ]


def test_idle_fraction_is_the_waiting_share_of_a_step() -> None:
    step = {"timing/wait_for_data_s": 1.0, "timing/train_step_s": 2.5}
    assert idle_fraction({**step, "timing/publish_weights_s": 0.5}) == 1.0 / 4.0
    assert idle_fraction(step) is None  # a step that does not say all three
    assert idle_fraction({**step, "timing/publish_weights_s": float("nan")}) is None
