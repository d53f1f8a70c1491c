"""The sandbox service's own scoring policy: which tests a repository has and what they protect.

A job request names a repository and carries a patch, nothing else: how the tests are run, which
paths a patch may not change and whether that is checked are the service operator's decision
(``dockyard sandbox serve --policy FILE``), never a client's. The file is YAML::

    default:                  # every repository not listed under repos
      framework: pytest       # or unittest
      test_paths: [tests]     # directories (relative to the repository root) holding the tests
      protected_paths: []     # globs a patch may not change, beyond the built-in set
    repos:
      calc: {framework: unittest}
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dockyard.environments.swe.integrity import DEFAULT_PROTECTED_PATHS


class RepoPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: Literal["pytest", "unittest"] = "pytest"
    test_paths: tuple[str, ...] = Field(("tests",), min_length=1)
    protected_paths: tuple[str, ...] = ()
    #: score a patch whose changed Python files have a reward-hack shape 0 without running it
    #: (reward_hack_screen.py); off for a repository whose product code is test tooling
    screen_reward_hacks: bool = True

    @field_validator("test_paths")
    @classmethod
    def _relative(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            pure = PurePosixPath(path)
            if not path or pure.is_absolute() or ".." in pure.parts or path.startswith("-"):
                raise ValueError(f"test path {path!r} must be relative, inside the repository")
        return tuple(PurePosixPath(path).as_posix() for path in paths)

    def protected_patterns(self) -> list[str]:
        """The built-in globs, the extra ones, and everything under a test path."""
        under_tests = [pattern for path in self.test_paths for pattern in (path, f"{path}/*")]
        return [*DEFAULT_PROTECTED_PATHS, *self.protected_paths, *under_tests]


class ServicePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: RepoPolicy = Field(default_factory=RepoPolicy)
    repos: dict[str, RepoPolicy] = Field(default_factory=dict)

    def for_repo(self, repo: str) -> RepoPolicy:
        return self.repos.get(repo, self.default)


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the file and the problem."""


def load_policy(path: Path | None) -> ServicePolicy:
    if path is None:
        return ServicePolicy()
    try:
        data = yaml.safe_load(path.read_text()) or {}
        return ServicePolicy.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise PolicyError(f"--policy {path}: {error}") from None
