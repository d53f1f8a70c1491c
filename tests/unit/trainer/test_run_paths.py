"""Where a run's files go: ``logger.log_dir`` and ``checkpointing.checkpoint_dir`` are honoured
(None = the run directory and ``<run>/checkpoints``; relative = inside the run directory;
absolute = as given), and ``policy.tokenizer.name`` reaches the trainer's own tokenizer."""

from __future__ import annotations

from pathlib import Path

from dockyard.config.sections.checkpointing import CheckpointingConfig
from dockyard.config.sections.logger import LoggerConfig
from tests.unit.trainer.test_trainer_accounting import trainer


def test_directories_default_to_the_run_directory_and_resolve_inside_it():
    run = Path("/runs/r1")
    assert LoggerConfig().directory(run) == run
    assert LoggerConfig(log_dir="metrics").directory(run) == run / "metrics"
    assert LoggerConfig(log_dir="/shared/logs").directory(run) == Path("/shared/logs")
    assert CheckpointingConfig().directory(run) == run / "checkpoints"
    assert CheckpointingConfig(checkpoint_dir="ckpt").directory(run) == run / "ckpt"
    assert CheckpointingConfig(checkpoint_dir="/nfs/ckpt").directory(run) == Path("/nfs/ckpt")


async def test_the_trainer_writes_metrics_and_checkpoints_where_the_config_says(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    async with trainer(
        run_dir,
        "grpo.max_num_steps=2",
        "checkpointing.enabled=true",
        "checkpointing.save_period=1",
        "checkpointing.metric_name=null",
        "logger.log_dir=metrics",
        f"checkpointing.checkpoint_dir={elsewhere}",
    ) as loop:
        await loop.run()
    assert (run_dir / "metrics" / "metrics.jsonl").exists()
    assert (run_dir / "metrics" / "progress.png").exists()
    assert not (run_dir / "metrics.jsonl").exists()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["step_1", "step_2"]
    assert not (run_dir / "checkpoints").exists()
