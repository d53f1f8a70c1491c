"""The dependency rules of DESIGN.md, checked on the source: imports point one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dockyard"

# package -> packages of dockyard it must never import
FORBIDDEN: dict[str, set[str]] = {
    "schemas": {
        "broker",
        "producers",
        "consumers",
        "algorithms",
        "environments",
        "engines",
        "models",
        "fleet",
        "commands",
        "data",
        "utils",
    },
    "broker": {"producers", "consumers", "fleet", "commands", "engines", "environments"},
    "producers": {"consumers", "fleet", "commands"},
    "consumers": {"producers", "fleet", "commands"},
    "algorithms": {"broker", "producers", "consumers", "fleet", "commands", "engines"},
    "environments": {"broker", "producers", "consumers", "fleet", "commands"},
    "config": {"broker", "producers", "consumers", "fleet", "commands", "engines"},
}


def dockyard_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "dockyard" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_what_it_must_not(package):
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(dockyard_imports(path) & FORBIDDEN[package])
        for path in (PACKAGE / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
