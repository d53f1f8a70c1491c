"""Typed configuration errors: every problem carries the key path it is about."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigIssue:
    """One problem with a config: ``path`` is dotted (``grpo.async_grpo.enabled``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """A config that cannot be loaded or is invalid. Carries every issue found, not just one."""

    def __init__(self, issues: Iterable[ConfigIssue] | str, *, source: str | None = None) -> None:
        if isinstance(issues, str):
            issues = [ConfigIssue("", issues)]
        self.issues: list[ConfigIssue] = list(issues)
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        where = f" ({self.source})" if self.source else ""
        if len(self.issues) == 1:
            return f"invalid config{where}: {self.issues[0]}"
        lines = [f"invalid config{where}: {len(self.issues)} problems"]
        lines += [f"  - {issue}" for issue in self.issues]
        return "\n".join(lines)
