"""Every environment test must leave no sandboxed process behind (checked after each test)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_probes import describe, live_sandbox_processes


@pytest.fixture(autouse=True)
def no_stray_sandbox_processes() -> Iterator[None]:
    yield
    leftovers = live_sandbox_processes()
    assert leftovers == [], f"a sandboxed process outlived its test: {describe(leftovers)}"


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A world-traversable directory the sandbox sees (read-only): not under /tmp, which is the
    run's own there."""
    directory = Path(tempfile.mkdtemp(prefix="dockyard-test-", dir="/var/tmp"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
