"""The dashboard as its users start it: ``dockyard dashboard`` in a process of its own."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.integration.e2e.conftest import ROOT

_READY = re.compile(r"dashboard at (http://\S+)")

Dashboard = Callable[..., "contextmanager[str]"]


@contextmanager
def running_dashboard(*args: str) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "dockyard", "--log-format", "json", "dashboard", "--port", "0",
         *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends when the process does
            if match := _READY.search(line):
                yield match.group(1)
                break
        else:
            raise AssertionError(f"dashboard exited: {process.stderr.read()}")  # type: ignore[union-attr]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def dashboard() -> Callable[..., object]:
    return running_dashboard
