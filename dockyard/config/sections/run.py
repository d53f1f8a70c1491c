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
