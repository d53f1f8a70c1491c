"""Each backend writes real files in a temp dir; each is read back with the tracker's reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tracker_file_readers import (
    read_swanlab_scalars,
    read_tensorboard_scalars,
    read_tensorboard_text,
    read_wandb_offline_run,
    swanlab_config_file,
)

from dockyard.config.sections.logger import LoggerConfig
from dockyard.observability.metrics import MetricsLogger

TIMELINE = {"worker-0": [2.0, 10.0], "worker-1": [1.0, 3.0]}
HYPERPARAMS = {"policy": {"model_name": "tiny", "lr": 1e-5}, "grpo": {"group": 4}}


def _log_two_steps(logger: MetricsLogger) -> None:
    logger.log_hyperparams(HYPERPARAMS)
    logger.log_metrics({"loss": 1.5, "lengths": [1, 2, 3, 4]}, step=0, prefix="train")
    logger.log_metrics({"generation_timeline": TIMELINE}, step=0, prefix="timing")
    logger.log_metrics({"loss": 1.25, "lengths": [10]}, step=1, prefix="train")


def test_jsonl_always_written_with_full_values(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger:
        assert logger.backend_names == ["jsonl"]
        _log_two_steps(logger)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(line["step"], line["metrics"]) for line in lines] == [
        (0, {"train/loss": 1.5, "train/lengths": [1, 2, 3, 4]}),
        (0, {"timing/generation_timeline": TIMELINE}),
        (1, {"train/loss": 1.25, "train/lengths": [10]}),
    ]
    assert json.loads((tmp_path / "hyperparams.json").read_text()) == HYPERPARAMS


def test_tensorboard_scalars_and_summaries(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(tensorboard_enabled=True), log_dir=tmp_path) as logger:
        _log_two_steps(logger)
    scalars = read_tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["train/loss"] == [(0, 1.5), (1, 1.25)]
    assert scalars["train/lengths/p90"] == [(0, pytest.approx(3.7)), (1, 10.0)]
    assert scalars["timing/generation_timeline/p50"] == [(0, 2.5)]
    assert scalars["timing/generation_timeline/max"] == [(0, 10.0)]
    assert "train/lengths" not in scalars
    text = read_tensorboard_text(tmp_path / "tensorboard", "hyperparams")
    assert json.loads(text.removeprefix("```json\n").removesuffix("\n```")) == HYPERPARAMS


@pytest.mark.slow
def test_mlflow_sqlite_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    config = LoggerConfig(mlflow_enabled=True)
    with MetricsLogger(config, log_dir=tmp_path) as logger:
        _log_two_steps(logger)
        logger.log_metrics({"reward@k": 0.5}, step=2)
    database = tmp_path / "mlflow" / "mlflow.db"
    assert database.is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("dockyard")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(point.step, point.value) for point in history] == [(0, 1.5), (1, 1.25)]
    timeline_mean = client.get_metric_history(run.info.run_id, "timing/generation_timeline/mean")
    assert [(point.step, point.value) for point in timeline_mean] == [(0, 4.0)]
    sanitised = client.get_metric_history(run.info.run_id, "reward_k")
    assert [(point.step, point.value) for point in sanitised] == [(2, 0.5)]
    assert run.data.params["policy.model_name"] == "tiny"
    assert float(run.data.params["policy.lr"]) == 1e-5
    assert set(run.data.metrics) == {
        "train/loss",
        *(f"train/lengths/{suffix}" for suffix in ("mean", "p50", "p90", "max")),
        *(f"timing/generation_timeline/{suffix}" for suffix in ("mean", "p50", "p90", "max")),
        "reward_k",
    }


@pytest.mark.slow
def test_wandb_offline_run_keeps_full_series(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(wandb_enabled=True), log_dir=tmp_path) as logger:
        _log_two_steps(logger)
    run = read_wandb_offline_run(tmp_path / "wandb")
    # Every point arrives, in order, at increasing steps (W&B's own step numbering is its
    # business; occasionally its offline writer offsets it, so rows are matched by order).
    assert [row["train/loss"] for row in run.history] == [1.5, 1.25]
    steps = [row["_step"] for row in run.history]
    assert steps == sorted(set(steps))
    rows = dict(enumerate(run.history))
    assert rows[0]["train/lengths"] == [1, 2, 3, 4]
    # W&B stores the per-worker mapping as nested keys, one full series per worker.
    timeline = {
        key.removeprefix("timing/generation_timeline/"): value
        for key, value in rows[0].items()
        if key.startswith("timing/generation_timeline/")
    }
    assert timeline == TIMELINE
    assert rows[1]["train/loss"] == 1.25 and rows[1]["train/lengths"] == [10]
    assert run.config["policy"] == {"model_name": "tiny", "lr": 1e-5}


@pytest.mark.slow
def test_swanlab_offline_run(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(swanlab_enabled=True), log_dir=tmp_path) as logger:
        _log_two_steps(logger)
    points = {(p.key, p.step): p.value for p in read_swanlab_scalars(tmp_path / "swanlab")}
    assert points[("train/loss", 0)] == 1.5
    assert points[("train/loss", 1)] == 1.25
    assert points[("train/lengths/mean", 0)] == 2.5
    assert points[("timing/generation_timeline/p90", 0)] == pytest.approx(7.9)
    assert not any(key == "train/lengths" for key, _ in points)
    config = yaml.safe_load(swanlab_config_file(tmp_path / "swanlab").read_text())
    assert config["policy"]["value"] == {"model_name": "tiny", "lr": 1e-5}


def test_trackers_get_the_config_without_its_secrets(tmp_path: Path) -> None:
    """A tracker run is often shared or uploaded: the broker password, token and URL password
    must not reach it, while the private hyperparams.json (what a retrain reconnects with)
    keeps them, readable by its owner only."""
    secrets = {
        "data_plane": {
            "servers": ["nats://trainer:s3cret-url@broker:4222", "nats://broker-2:4222"],
            "credentials": {"user": "trainer", "password": "s3cret-pw", "token": None},
        },
        "sandbox": {"token": "s3cret-token"},
    }
    with MetricsLogger(LoggerConfig(tensorboard_enabled=True), log_dir=tmp_path) as logger:
        logger.log_hyperparams(secrets)
    text = read_tensorboard_text(tmp_path / "tensorboard", "hyperparams")
    assert "s3cret" not in text
    shown = json.loads(text.removeprefix("```json\n").removesuffix("\n```"))
    assert shown["data_plane"]["servers"] == [
        "nats://trainer:<redacted>@broker:4222",
        "nats://broker-2:4222",
    ]
    assert shown["data_plane"]["credentials"] == {
        "user": "trainer",
        "password": "<redacted>",
        "token": None,
    }
    assert shown["sandbox"] == {"token": "<redacted>"}
    private = tmp_path / "hyperparams.json"
    assert json.loads(private.read_text()) == secrets
    assert private.stat().st_mode & 0o777 == 0o600
