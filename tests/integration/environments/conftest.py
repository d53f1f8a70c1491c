"""Every environment test must leave no sandboxed process behind (checked after each test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sandbox_ownership import our_live_sandbox_processes


@pytest.fixture(autouse=True)
def no_stray_sandbox_processes() -> Iterator[None]:
    yield
    leftovers = our_live_sandbox_processes()
    assert leftovers == [], "a sandboxed process outlived its test"
