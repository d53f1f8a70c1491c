"""The run's PNG: reward and validation accuracy per step, read back from ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path


def plot_run(metrics_path: Path, out_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reward: list[tuple[int, float]] = []
    accuracy: list[tuple[int, float]] = []
    for line in metrics_path.read_text().splitlines():
        record = json.loads(line)
        step, values = record["step"], record["metrics"]
        if "train/reward_mean" in values:
            reward.append((step, values["train/reward_mean"]))
        if "val/accuracy" in values:
            accuracy.append((step, values["val/accuracy"]))
    figure, axis = plt.subplots(figsize=(8, 4.5))
    if reward:
        axis.plot(*zip(*reward, strict=True), label="train reward (mean)", alpha=0.7)
    if accuracy:
        axis.plot(*zip(*accuracy, strict=True), "o-", label="validation accuracy")
    axis.set_xlabel("step")
    axis.set_ylim(0, 1)
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title("dockyard run")
    figure.tight_layout()
    figure.savefig(out_path, dpi=100)
    plt.close(figure)
    return out_path
