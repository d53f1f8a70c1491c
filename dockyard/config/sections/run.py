"""``run``: how ``dockyard run`` lays out a fleet on one machine, and trainer health limits."""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


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

    def rule_issues(self) -> list[ConfigIssue]:
        if self.starvation_timeout_s <= self.starvation_warning_s:
            return [
                ConfigIssue(
                    "starvation_timeout_s",
                    f"must exceed starvation_warning_s ({self.starvation_warning_s})",
                )
            ]
        return []
