"""List summarisation and per-worker timeline merging, on hand-computed data."""

from __future__ import annotations

import pytest

from dockyard.observability.metrics.base import MetricValueError
from dockyard.observability.metrics.summarize import (
    flatten_config,
    merge_per_worker,
    sanitize_mlflow_name,
    summarize_series,
    to_scalars,
)


def test_series_summary_by_hand() -> None:
    # sorted [1, 2, 3, 4]: p50 between 2 and 3; p90 at rank 0.9 * 3 = 2.7 -> 3 + 0.7 * (4 - 3)
    assert summarize_series([4, 1, 3, 2]) == pytest.approx(
        {"mean": 2.5, "p50": 2.5, "p90": 3.7, "max": 4.0}
    )


def test_single_value_series() -> None:
    assert summarize_series([7.0]) == {"mean": 7.0, "p50": 7.0, "p90": 7.0, "max": 7.0}


def test_timeline_is_merged_across_workers_before_reduction() -> None:
    timeline = {"worker-1": [1.0, 3.0], "worker-0": [2.0, 10.0]}
    assert sorted(merge_per_worker("t", timeline)) == [1.0, 2.0, 3.0, 10.0]
    scalars = to_scalars({"timing/generation_timeline": timeline})
    # merged sorted [1, 2, 3, 10]: mean 16/4, p50 (2+3)/2, p90 = 3 + 0.7 * (10 - 3)
    assert scalars == pytest.approx(
        {
            "timing/generation_timeline/mean": 4.0,
            "timing/generation_timeline/p50": 2.5,
            "timing/generation_timeline/p90": 7.9,
            "timing/generation_timeline/max": 10.0,
        }
    )
    # Merging first matters: averaging per-worker medians (6.0 and 2.0) would give 4.0, not 2.5.


def test_key_count_is_bounded_whatever_the_number_of_workers_and_requests() -> None:
    timeline = {f"w{worker}": [float(r) for r in range(100)] for worker in range(64)}
    scalars = to_scalars({"timing/generation_timeline": timeline, "lengths": list(range(5000))})
    assert len(scalars) == 8


def test_scalars_pass_through_and_bools_become_ints() -> None:
    assert to_scalars({"loss": 0.5, "count": 3, "flag": True}) == {
        "loss": 0.5,
        "count": 3,
        "flag": 1,
    }


def test_empty_series_has_no_summary_keys() -> None:
    assert to_scalars({"empty": [], "timeline": {"w0": []}}) == {}


@pytest.mark.parametrize(
    "value", ["text", ["a", 1.0], {"w0": [1.0, "x"]}, {"w0": 3.0}, None, b"raw"]
)
def test_bad_values_are_refused(value: object) -> None:
    with pytest.raises(MetricValueError):
        to_scalars({"metric": value})  # type: ignore[dict-item]


def test_mlflow_name_sanitising() -> None:
    assert sanitize_mlflow_name("train/loss (mean):v1.2-x_y") == "train/loss _mean_:v1.2-x_y"
    assert sanitize_mlflow_name("reward@k=5") == "reward_k_5"


def test_flatten_config() -> None:
    assert flatten_config({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}) == {
        "a.b": 1,
        "a.c.d": [1, 2],
        "e": {},
        "f": None,
    }
