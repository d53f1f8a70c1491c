"""``env``: per-environment settings, one typed model per registered environment."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


class EnvSettings(Section):
    """What every environment has: a task timeout with a defined reward, and concurrency."""

    task_timeout: PositiveFloat = Field(60.0, description="seconds per scoring task")
    timeout_reward: float = Field(0.0, description="reward given to a sample that timed out")
    max_concurrency: PositiveInt = Field(8, description="tasks in flight per scorer instance")
    num_scoring_workers: PositiveInt = Field(1, description="scorer processes for this env")


class MathEnvConfig(EnvSettings):
    answer_format: Literal["boxed_or_last_number", "boxed", "last_number"] = "boxed_or_last_number"
    symbolic_equivalence: bool = True
    relative_tolerance: float = Field(1e-6, ge=0.0)


class ArithmeticEnvConfig(EnvSettings):
    """The quickstart task: exact integer answers."""


class SandboxLimits(Section):
    cpu_time_s: PositiveFloat = 10.0
    wall_time_s: PositiveFloat = 20.0
    memory_mb: PositiveInt = 512
    max_output_bytes: PositiveInt = 1_000_000
    max_processes: PositiveInt = 32
    max_file_size_mb: PositiveInt = 64


class CodeEnvConfig(EnvSettings):
    reward_mode: Literal["fraction", "all_pass"] = "fraction"
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


class SWEEnvConfig(EnvSettings):
    reward_mode: Literal["binary", "fraction"] = "binary"
    integrity_check: bool = Field(True, description="refuse patches that touch tests/runner")
    sandbox_urls: list[str] = Field(default_factory=list)
    connect_retries: PositiveInt = 3
    task_timeout: PositiveFloat = 1800.0
    limits: SandboxLimits = Field(default_factory=SandboxLimits)


class TeacherEnvConfig(EnvSettings):
    """The OPD teacher scorer: attaches teacher log-probs of the sampled tokens."""

    batch_size: PositiveInt = 8
    device: str = "cpu"


class EnvConfig(Section):
    math: MathEnvConfig = Field(default_factory=MathEnvConfig)
    arithmetic: ArithmeticEnvConfig = Field(default_factory=ArithmeticEnvConfig)
    code: CodeEnvConfig = Field(default_factory=CodeEnvConfig)
    swe: SWEEnvConfig = Field(default_factory=SWEEnvConfig)
    teacher: TeacherEnvConfig = Field(default_factory=TeacherEnvConfig)

    def rule_issues(self) -> list[ConfigIssue]:
        return []
