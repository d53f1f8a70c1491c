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
