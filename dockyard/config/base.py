"""The base model of every config section, and the rule-checking protocol.

Sections keep unknown keys (``extra="allow"``) so nothing a subsystem may read is lost; the loader
reports them as warnings with a "did you mean" suggestion (see :mod:`dockyard.config.unknown_keys`).

Cross-field rules are written as ``rule_issues()`` returning :class:`ConfigIssue` objects with
paths *relative to the section*. The after-validator raises them together as one pydantic error of
type ``config_rules``; the loader prefixes the section's location, so the same check gives the full
key path both at launch (``loss_fn.use_cispo``) and when a section is built directly in code.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from dockyard.config.errors import ConfigIssue

RULES_ERROR_TYPE = "config_rules"


class Section(BaseModel):
    model_config = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)

    def rule_issues(self) -> list[ConfigIssue]:
        """Cross-field rules of this section; override in sections that have any."""
        return []

    @model_validator(mode="after")
    def _check_rules(self) -> Section:
        issues = self.rule_issues()
        if issues:
            raise PydanticCustomError(
                RULES_ERROR_TYPE,
                "{summary}",
                {"summary": "; ".join(str(issue) for issue in issues), "issues": issues},
            )
        return self


def check_finite(value: float | None, path: str, hint: str) -> list[ConfigIssue]:
    """Non-finite numbers are refused rather than forwarded to an engine or optimizer."""
    if value is not None and not math.isfinite(value):
        return [ConfigIssue(path, f"must be a finite number, got {value}; {hint}")]
    return []
