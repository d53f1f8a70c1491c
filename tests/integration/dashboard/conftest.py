"""The dashboard as its users start it: ``dockyard dashboard`` in a process of its own."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.integration.e2e.conftest import start_dockyard, stop

_READY = re.compile(r"dashboard at (http://\S+)")


@contextmanager
def running_dashboard(*args: str) -> Iterator[str]:
    process = start_dockyard("dashboard", "--port", "0", *args)
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends when the process does
            if match := _READY.search(line):
                yield match.group(1)
                break
        else:
            raise AssertionError(f"dashboard exited: {process.stderr.read()}")  # type: ignore[union-attr]
    finally:
        stop(process, timeout_s=60)


@pytest.fixture
def dashboard() -> Callable[..., object]:
    return running_dashboard
