"""The fan-out's own rules: launch-time package check, step order, hyperparams once, all four."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tracker_file_readers import (
    read_swanlab_scalars,
    read_tensorboard_scalars,
    read_wandb_offline_run,
)

from dockyard.config.sections.logger import LoggerConfig
from dockyard.observability.metrics import (
    MetricsLogger,
    MetricsLoggerError,
    MetricValueError,
    MissingBackendPackageError,
    StepOrderError,
)


def _jsonl_steps(log_dir: Path) -> list[int]:
    return [
        json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.parametrize(
    ("flag", "module", "hint"),
    [
        ("mlflow_enabled", "mlflow", "mlflow-skinny"),
        ("mlflow_enabled", "alembic", "alembic"),
        ("tensorboard_enabled", "tensorboardX", "tensorboardX"),
        ("wandb_enabled", "wandb", "wandb"),
        ("swanlab_enabled", "swanlab", "swanlab"),
    ],
)
def test_missing_package_fails_at_construction_with_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, module: str, hint: str
) -> None:
    # Stand-in for "not installed": a None entry in sys.modules makes `import module` raise
    # ImportError, exactly as an absent package does.
    monkeypatch.setitem(sys.modules, module, None)
    config = LoggerConfig(**{flag: True, "tensorboard_enabled": True})
    with pytest.raises(MissingBackendPackageError) as raised:
        MetricsLogger(config, log_dir=tmp_path)
    message = str(raised.value)
    assert "pip install 'dockyard[loggers]'" in message
    assert f"pip install {hint}" in message
    # Nothing was started: no backend wrote anything before the check failed.
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_step_going_backwards_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(tensorboard_enabled=True), log_dir=tmp_path) as logger:
        logger.log_metrics({"loss": 1.0}, step=5)
        logger.log_metrics({"reward": 0.5}, step=5)  # same step again is fine
        with pytest.raises(StepOrderError, match="step 4 is lower than the last logged step 5"):
            logger.log_metrics({"loss": 9.0}, step=4)
        logger.log_metrics({"loss": 0.5}, step=6)
        assert logger.last_step == 6
    assert _jsonl_steps(tmp_path) == [5, 5, 6]
    assert read_tensorboard_scalars(tmp_path / "tensorboard")["loss"] == [(5, 1.0), (6, 0.5)]


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_invalid_steps(tmp_path: Path, step: object) -> None:
    with MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger, pytest.raises(StepOrderError):
        logger.log_metrics({"loss": 1.0}, step=step)  # type: ignore[arg-type]


def test_bad_value_is_refused_before_any_backend_writes(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(tensorboard_enabled=True), log_dir=tmp_path) as logger:
        with pytest.raises(MetricValueError, match="'text'"):
            logger.log_metrics({"loss": 1.0, "text": "oops"}, step=0)
        logger.log_metrics({"loss": 2.0}, step=0)
    assert _jsonl_steps(tmp_path) == [0]
    assert read_tensorboard_scalars(tmp_path / "tensorboard")["loss"] == [(0, 2.0)]


def test_hyperparams_logged_once(tmp_path: Path) -> None:
    with MetricsLogger(LoggerConfig(), log_dir=tmp_path) as logger:
        logger.log_hyperparams(LoggerConfig(log_dir="x"))  # a pydantic model is dumped as JSON
        with pytest.raises(MetricsLoggerError, match="already logged"):
            logger.log_hyperparams({"other": 1})
    assert json.loads((tmp_path / "hyperparams.json").read_text())["log_dir"] == "x"


def test_closed_logger_refuses_calls(tmp_path: Path) -> None:
    logger = MetricsLogger(LoggerConfig(), log_dir=tmp_path)
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(MetricsLoggerError, match="closed"):
        logger.log_metrics({"loss": 1.0}, step=0)


@pytest.mark.slow
def test_all_four_backends_together_each_in_its_own_directory(tmp_path: Path) -> None:
    config = LoggerConfig(
        wandb_enabled=True, tensorboard_enabled=True, mlflow_enabled=True, swanlab_enabled=True
    )
    with MetricsLogger(config, log_dir=tmp_path) as logger:
        assert logger.backend_names == ["jsonl", "wandb", "tensorboard", "mlflow", "swanlab"]
        logger.log_hyperparams({"seed": 1})
        for step in range(3):
            logger.log_metrics({"loss": 1.0 / (step + 1), "lengths": [step, step + 2]}, step=step)
    assert {path.name for path in tmp_path.iterdir()} >= {
        "metrics.jsonl",
        "hyperparams.json",
        "wandb",
        "tensorboard",
        "mlflow",
        "swanlab",
    }
    assert [row["lengths"] for row in read_wandb_offline_run(tmp_path / "wandb").history] == [
        [0, 2],
        [1, 3],
        [2, 4],
    ]
    assert read_tensorboard_scalars(tmp_path / "tensorboard")["lengths/mean"] == [
        (0, 1.0),
        (1, 2.0),
        (2, 3.0),
    ]
    swanlab = {(p.key, p.step): p.value for p in read_swanlab_scalars(tmp_path / "swanlab")}
    assert swanlab[("lengths/max", 2)] == 4.0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("dockyard").experiment_id])
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(p.step, p.value) for p in history] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
