"""Every environment test must leave no sandboxed process behind (checked after each test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox.identity import live_processes_in_uid_range, sandbox_uid_range


@pytest.fixture(autouse=True)
def no_stray_sandbox_processes() -> Iterator[None]:
    yield
    leftovers = live_processes_in_uid_range(sandbox_uid_range(SandboxLimits()))
    assert leftovers == [], "a sandboxed process outlived its test"
