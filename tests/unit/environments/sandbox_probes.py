"""Helpers for the sandbox tests: processes owned by sandbox uids, a root-only marker."""

from __future__ import annotations

import os

import pytest

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox.identity import live_processes_in_uid_range, sandbox_uid_range


def live_sandbox_processes() -> list[int]:
    """Non-zombie processes owned by any uid of the default sandbox range."""
    return live_processes_in_uid_range(sandbox_uid_range(SandboxLimits()))


requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="privilege drop and network namespaces need root"
)
