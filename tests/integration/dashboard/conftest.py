"""The dashboard as its users start it: ``dockyard dashboard`` in a process of its own."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from tests.integration.e2e.conftest import start_dockyard, stop

_READY = re.compile(r"dashboard at (http://\S+)")


@dataclass
class RunningDashboard:
    url: str
    stderr: str = ""  # what the process logged, once it ended


@contextmanager
def running_dashboard(*args: str) -> Iterator[RunningDashboard]:
    process = start_dockyard("dashboard", "--port", "0", *args)
    running = None
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends when the process does
            if match := _READY.search(line):
                running = RunningDashboard(match.group(1))
                yield running
                break
        else:
            raise AssertionError(f"dashboard exited: {process.stderr.read()}")  # type: ignore[union-attr]
    finally:
        _, stderr = stop(process, timeout_s=60)
        if running is not None:
            running.stderr = stderr
    assert process.returncode == 0, stderr[-3000:]  # SIGTERM: a clean stop


@pytest.fixture
def dashboard() -> Callable[..., object]:
    return running_dashboard
