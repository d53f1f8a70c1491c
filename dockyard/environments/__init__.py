"""Reward environments: pure functions of a prompt group, no transport.

- :func:`build_environment` (``name`` -> environment built from ``env.<name>``), the registry
  decorator :func:`register_environment`;
- :class:`ScoringGroup` in, :class:`GroupScore` out (``await environment.score(group)``);
- :func:`score_with_timeout` for the scorer's ``env.<name>.task_timeout``.

Environment modules (and their heavy imports: sympy, httpx, torch) load on first use by name.
"""

from dockyard.environments.base import (
    Environment,
    EnvironmentContext,
    GroupScore,
    InvalidScoringInput,
    JSONValue,
    SampleInput,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.registry import (
    UnknownEnvironmentError,
    available_environments,
    build_environment,
    environment_class,
    register_environment,
)
from dockyard.environments.timeouts import score_with_timeout

__all__ = [
    "Environment",
    "EnvironmentContext",
    "GroupScore",
    "InvalidScoringInput",
    "JSONValue",
    "SampleInput",
    "SampleScore",
    "ScoreFlag",
    "ScoringGroup",
    "UnknownEnvironmentError",
    "available_environments",
    "build_environment",
    "environment_class",
    "register_environment",
    "score_with_timeout",
]
