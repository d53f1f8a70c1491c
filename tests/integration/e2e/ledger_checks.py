"""Reading a run's own records back: metrics, ledger, checkpoints."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from dockyard.consumers.trainer.ledger import read_trail


def metric_steps(run_dir: Path) -> list[int]:
    steps = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "train/reward_mean" in record["metrics"]:
            steps.append(record["step"])
    return steps


def assert_staleness_histograms_count_each_trained_sample(
    run_dir: Path, generations_per_group: int
) -> None:
    """Each step's ``staleness/samples_at_age_K`` metrics (the dashboard's histogram) add up to
    the samples of the groups the ledger says that step trained, and no age is negative."""
    events = read_trail(run_dir / "ledger.jsonl")
    trained_at = Counter(e["step"] for e in events if e["event"] == "trained")
    histograms = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        ages = {
            int(key.rsplit("_", 1)[1]): value
            for key, value in record["metrics"].items()
            if key.startswith("staleness/samples_at_age_")
        }
        if ages:
            histograms[record["step"]] = ages
    assert set(histograms) == set(trained_at)
    for step, ages in histograms.items():
        assert sum(ages.values()) == trained_at[step] * generations_per_group, (step, ages)
        assert min(ages) >= 0, (step, ages)


def assert_exactly_once(run_dir: Path) -> Counter[str]:
    """Every dispatched group is trained exactly once or explicitly dropped; nothing else."""
    events = read_trail(run_dir / "ledger.jsonl")
    dispatched = Counter(e["group_id"] for e in events if e["event"] == "dispatched")
    trained = Counter(e["group_id"] for e in events if e["event"] == "trained")
    dropped = Counter(e["group_id"] for e in events if e["event"] == "dropped")
    assert all(count == 1 for count in trained.values()), trained.most_common(3)
    assert not set(trained) & set(dropped)
    assert set(trained) | set(dropped) <= set(dispatched)
    return trained


def assert_every_group_accounted(run_dir: Path) -> None:
    """A run that ended by itself names every group it dispatched: trained, dropped, or still
    open at the end (each once)."""
    events = read_trail(run_dir / "ledger.jsonl")
    by_kind = {
        kind: Counter(e["group_id"] for e in events if e["event"] == kind)
        for kind in ("dispatched", "trained", "dropped", "open_at_end")
    }
    settled = by_kind["trained"] + by_kind["dropped"] + by_kind["open_at_end"]
    assert set(settled) == set(by_kind["dispatched"]), set(by_kind["dispatched"]) ^ set(settled)
    assert all(count == 1 for count in settled.values()), settled.most_common(3)
    open_events = [e for e in events if e["event"] == "open_at_end"]
    assert all("max_num_steps" in e["reason"] for e in open_events)
