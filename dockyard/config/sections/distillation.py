"""``on_policy_distillation``: teachers for the OPD advantage estimator."""

from __future__ import annotations

from pydantic import Field

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


class TeacherModelConfig(Section):
    model_name: str = Field(
        description="the teacher's model (HF directory, name or tiny://); with base_url, the "
        "model name the server is asked for (it refuses a name it does not serve)"
    )
    precision: str | None = Field(
        None,
        description="the precision the scorer loads the teacher in (None: bfloat16); only "
        "without base_url, where the server's own precision applies",
    )
    base_url: str | None = Field(
        None,
        description="the teacher's engine server (OpenAI-compatible /v1/completions answering "
        "prompt_logprobs: dockyard model serve, or vLLM's server); None: the scorer loads the "
        "teacher in its own process",
    )

    def rule_issues(self) -> list[ConfigIssue]:
        if self.base_url is None:
            return []
        if not self.base_url.startswith(("http://", "https://")):
            return [ConfigIssue("base_url", f"{self.base_url!r} is not an http(s) URL")]
        if self.precision is not None:
            # The server loaded the model: a precision here would be silently ignored.
            return [
                ConfigIssue(
                    "precision",
                    "a served teacher runs in its server's precision (dockyard model serve "
                    "--precision, or the recipe's teacher_servers); remove it or base_url",
                )
            ]
        return []


class OnPolicyDistillationConfig(Section):
    enabled: bool = False
    teachers: dict[str, TeacherModelConfig] = Field(
        default_factory=dict, description="teacher alias -> model"
    )
    teacher_model_by_agent_name: dict[str, str] = Field(
        default_factory=dict, description="agent name -> teacher alias"
    )
    default_teacher_alias: str | None = None
    strict_agent_name_match: bool = Field(
        False, description="refuse a rollout whose agent has no teacher instead of the default"
    )

    def rule_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        known = set(self.teachers)
        # With OPD on, every alias must name a teacher (an empty map included): the scorer
        # looks teachers up by alias. Off, the mapping is only checked against what is given.
        check = self.enabled or bool(known)
        listed = ", ".join(sorted(known)) or "none defined"
        for agent, alias in self.teacher_model_by_agent_name.items():
            if check and alias not in known:
                issues.append(
                    ConfigIssue(
                        f"teacher_model_by_agent_name.{agent}",
                        f"teacher {alias!r} is not in teachers ({listed})",
                    )
                )
        if self.default_teacher_alias and check and self.default_teacher_alias not in known:
            issues.append(
                ConfigIssue(
                    "default_teacher_alias", f"{self.default_teacher_alias!r} is not in teachers"
                )
            )
        if self.enabled and not self.teacher_model_by_agent_name and not self.default_teacher_alias:
            issues.append(
                ConfigIssue(
                    "default_teacher_alias",
                    "OPD needs a teacher: set default_teacher_alias or teacher_model_by_agent_name",
                )
            )
        return issues
