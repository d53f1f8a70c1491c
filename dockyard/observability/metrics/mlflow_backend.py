"""MLflow: scalars only, names sanitised, a sqlite tracking store in the log dir by default.

``tracking_uri: null`` means ``sqlite:////<log_dir>/mlflow/mlflow.db`` with artifacts beside it,
so nothing needs a server or the network; a configured URI (``http://...``) is passed through.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from dockyard.config.sections.logger import MlflowConfig
from dockyard.observability.metrics.base import (
    MetricsLoggerError,
    MetricValue,
    import_backend_package,
)
from dockyard.observability.metrics.summarize import flatten_config, sanitize_mlflow_name

# MLflow's limits: 1000 metrics / 100 params per batch call, 6000 characters per param value.
_METRICS_PER_BATCH = 1000
_PARAMS_PER_BATCH = 100
_MAX_PARAM_VALUE_CHARS = 6000


class MlflowBackend:
    name = "mlflow"
    accepts_series = False

    def __init__(self, config: MlflowConfig, log_dir: Path) -> None:
        import_backend_package("mlflow", backend="mlflow", package="mlflow-skinny")
        import_backend_package("sqlalchemy", backend="mlflow", package="sqlalchemy")
        import_backend_package("alembic", backend="mlflow", package="alembic")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._metric_type = Metric
        self._param_type = Param
        log_dir.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = config.tracking_uri or f"sqlite:///{(log_dir / 'mlflow.db').resolve()}"
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self._client.get_experiment_by_name(config.experiment_name)
        if experiment is None:
            experiment_id = self._client.create_experiment(
                config.experiment_name,
                artifact_location=(log_dir / "artifacts").resolve().as_uri()
                if config.tracking_uri is None
                else None,
            )
        else:
            experiment_id = experiment.experiment_id
        self.run_id: str = self._client.create_run(
            experiment_id, run_name=config.run_name
        ).info.run_id
        # sanitised name -> original, to refuse two metrics that sanitise to the same name.
        self._names: dict[str, str] = {}
        self._closed = False

    def _sanitized(self, name: str) -> str:
        clean = sanitize_mlflow_name(name)
        previous = self._names.setdefault(clean, name)
        if previous != name:
            raise MetricsLoggerError(
                f"metrics {previous!r} and {name!r} both become {clean!r} in MLflow; rename one"
            )
        return clean

    def log_metrics(self, metrics: Mapping[str, MetricValue], step: int) -> None:
        timestamp_ms = int(time.time() * 1000)
        batch = [
            self._metric_type(self._sanitized(name), float(value), timestamp_ms, step)  # type: ignore[arg-type]  # scalars only reach this backend
            for name, value in metrics.items()
        ]
        for start in range(0, len(batch), _METRICS_PER_BATCH):
            self._client.log_batch(self.run_id, metrics=batch[start : start + _METRICS_PER_BATCH])

    def log_hyperparams(self, params: Mapping[str, object]) -> None:
        flat = flatten_config(params)
        batch = [
            self._param_type(sanitize_mlflow_name(key), str(value)[:_MAX_PARAM_VALUE_CHARS])
            for key, value in flat.items()
        ]
        for start in range(0, len(batch), _PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=batch[start : start + _PARAMS_PER_BATCH])
        # The full nested config too: params are truncated and flattened.
        self._client.log_dict(self.run_id, dict(params), "config.json")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.set_terminated(self.run_id, status="FINISHED")
