"""``run``: how ``dockyard run`` lays out a fleet on one machine, and trainer health limits."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


class TracingConfig(Section):
    """OpenTelemetry traces: each message's publish and receipt is a span, and the W3C trace
    context (``traceparent``) travels in the message's headers, so a group's path from the
    dispatcher through a rollout worker and a scorer to the trainer is one trace."""

    exporter: Literal["off", "otlp", "file"] = Field(
        "off",
        description="off: no spans are recorded (a traceparent that arrives is passed on); "
        "otlp: OTLP over HTTP to `endpoint`; file: one JSON span a line into `directory`",
    )
    endpoint: str | None = Field(
        None,
        description="with exporter otlp: the collector's traces URL "
        "(http://HOST:4318/v1/traces); null: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "OTEL_EXPORTER_OTLP_ENDPOINT from the environment, else http://localhost:4318/v1/traces",
    )
    directory: str | None = Field(
        None,
        description="with exporter file: each role process writes spans-<role>-<instance>.jsonl "
        "here (created if missing)",
    )

    def rule_issues(self) -> list[ConfigIssue]:
        issues = []
        if self.exporter == "file" and not self.directory:
            issues.append(ConfigIssue("directory", "exporter file writes its spans here: set it"))
        if self.directory and self.exporter != "file":
            issues.append(ConfigIssue("directory", "only the file exporter writes a directory"))
        if self.endpoint and self.exporter != "otlp":
            issues.append(ConfigIssue("endpoint", "only the otlp exporter sends to an endpoint"))
        return issues


class RunConfig(Section):
    name: str = Field("run", pattern=r"^[A-Za-z0-9_.-]+$")
    output_dir: str = Field("runs", description="run directories are created under it")
    num_rollout_workers: PositiveInt = 1
    num_scorers: PositiveInt = 1
    starvation_warning_s: PositiveFloat = Field(
        30.0, description="no scored data for this long: log which stage starves"
    )
    starvation_timeout_s: PositiveFloat = Field(
        600.0, description="no scored data for this long: end the run with the diagnosis"
    )
    role_start_timeout_s: PositiveFloat = Field(
        1800.0,
        description="no scored data for this long while a rollout worker or scorer still reports "
        "itself starting (loading its engine, waiting for the first weights): end the run naming "
        "it; starvation_timeout_s counts only once they are ready",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve Prometheus metrics at http://<metrics_host>:<port>/metrics from every "
        "role process; null: off; 0: each process takes a free port and writes it into its "
        "status file (metrics_port); N: one role per machine uses N, and `dockyard run` over a "
        "data plane gives the trainer N, rollout worker i N+1+i, scorer j "
        "N+1+num_rollout_workers+j (with data_plane: null the one process uses N)",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        min_length=1,
        description="the address the metrics endpoint listens on (0.0.0.0: every interface, "
        "for a Prometheus server on another machine)",
    )
    simulated_latency_per_token_s: float = Field(
        0.0,
        ge=0.0,
        description="benchmarking: each rollout batch also waits this long per generated token, "
        "as an engine with that decode latency would (isolates pipeline overlap from CPU load)",
    )

    tracing: TracingConfig = Field(
        default_factory=TracingConfig,
        description="OpenTelemetry traces across roles (W3C trace context in message headers)",
    )

    def rule_issues(self) -> list[ConfigIssue]:
        if self.starvation_timeout_s <= self.starvation_warning_s:
            return [
                ConfigIssue(
                    "starvation_timeout_s",
                    f"must exceed starvation_warning_s ({self.starvation_warning_s})",
                )
            ]
        return []
