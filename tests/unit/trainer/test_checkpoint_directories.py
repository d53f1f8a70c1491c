"""Crash-safe checkpoint directories and top-k retention."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.checkpoints.directories import CheckpointManager
from dockyard.config.sections.checkpointing import CheckpointingConfig


def write_marker(directory: Path) -> None:
    (directory / "model.bin").write_bytes(b"weights")


def manager(tmp_path: Path, **overrides: object) -> CheckpointManager:
    config = CheckpointingConfig(checkpoint_dir=str(tmp_path / "ckpt"), **overrides)
    return CheckpointManager(config)


def test_save_is_atomic_and_latest_finds_it(tmp_path):
    checkpoints = manager(tmp_path)
    info = checkpoints.save(10, write_marker, {"val:accuracy": 0.5})
    assert info.path.name == "step_10"
    assert (info.path / "model.bin").read_bytes() == b"weights"
    assert checkpoints.latest().step == 10
    assert checkpoints.latest().metrics == {"val:accuracy": 0.5}
    assert not list((tmp_path / "ckpt").glob("tmp_*"))


def test_a_crash_mid_save_leaves_no_checkpoint_and_is_cleaned_up(tmp_path):
    checkpoints = manager(tmp_path)
    checkpoints.save(10, write_marker)

    def crash(directory: Path) -> None:
        write_marker(directory)
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError):
        checkpoints.save(20, crash)
    assert checkpoints.latest().step == 10  # the partial step_20 is not a checkpoint
    assert (tmp_path / "ckpt" / "tmp_step_20").exists()
    manager(tmp_path)  # a restart removes the partial save
    assert not (tmp_path / "ckpt" / "tmp_step_20").exists()


def test_top_k_by_metric_keeps_the_best_periodic_and_the_latest(tmp_path):
    checkpoints = manager(tmp_path, keep_top_k=2, save_period=10, metric_name="val:accuracy")
    accuracies = {10: 0.3, 20: 0.7, 30: 0.5, 40: 0.7, 45: 0.1}
    for step, accuracy in accuracies.items():
        checkpoints.save(step, write_marker, {"val:accuracy": accuracy})
    kept = [info.step for info in checkpoints.list()]
    # Top 2 of the periodic ones: 0.7 at 40 and 0.7 at 20 (tie → newer first, both fit);
    # 45 is the latest (not periodic) and is always kept.
    assert kept == [20, 40, 45]


def test_lower_is_better_and_missing_metrics_rank_last(tmp_path):
    checkpoints = manager(
        tmp_path, keep_top_k=1, save_period=10, metric_name="val:loss", higher_is_better=False
    )
    checkpoints.save(10, write_marker, {"val:loss": 2.0})
    checkpoints.save(20, write_marker, {"val:loss": 1.0})
    checkpoints.save(30, write_marker, {"val:loss": 3.0})
    checkpoints.save(40, write_marker, {})
    assert [info.step for info in checkpoints.list()] == [20, 40]


def test_keep_latest_k_keeps_the_newest_as_well(tmp_path):
    checkpoints = manager(tmp_path, keep_top_k=1, keep_latest_k=2, save_period=10)
    for step, accuracy in [(10, 0.9), (20, 0.1), (30, 0.2)]:
        checkpoints.save(step, write_marker, {"val:accuracy": accuracy})
    assert [info.step for info in checkpoints.list()] == [10, 20, 30]
    checkpoints.save(40, write_marker, {"val:accuracy": 0.3})
    assert [info.step for info in checkpoints.list()] == [10, 30, 40]
