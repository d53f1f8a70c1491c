"""Which tests pytest-xdist must keep on one worker (``--dist loadgroup``, pyproject's addopts).

A module-scoped fixture (a torchrun world whose results a module's tests read, a vLLM engine, a
service) is set up once per worker that runs any of the module's tests: spread over two workers,
it would start twice. So every test that uses a module-scoped fixture is put in its module's
group, unless it names a group of its own (``xdist_group``, e.g. the session's vLLM judge).
Everything else is spread test by test.
"""

from __future__ import annotations

import pytest

SHARED_SCOPES = frozenset({"module", "package", "class"})


def uses_a_shared_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in SHARED_SCOPES
        for definitions in info.name2fixturedefs.values()
        if definitions
    )


def group_by_shared_fixtures(items: list[pytest.Item]) -> None:
    for item in items:
        if any(True for _ in item.iter_markers("xdist_group")):
            continue
        if uses_a_shared_fixture(item):
            module = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(f"module:{module}"))
