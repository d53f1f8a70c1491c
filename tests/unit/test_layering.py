"""The dependency rules of DESIGN.md, checked on the source: imports point one way.

Every import counts, wherever it is written: at module level, inside a function (a lazy import
still makes the importer depend on the imported) and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import networkx as nx
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
        "observability",
        "checkpoints",
        "export",
    },
    "broker": {"producers", "consumers", "fleet", "commands", "engines", "environments"},
    "producers": {"consumers", "fleet", "commands"},
    "consumers": {"producers", "fleet", "commands"},
    "algorithms": {"broker", "producers", "consumers", "fleet", "commands", "engines"},
    "environments": {"broker", "producers", "consumers", "fleet", "commands"},
    # DESIGN.md: config imports no other dockyard package (MasterConfig lives in config/; the
    # estimator registry is handed to the loader by its caller). utils.logging is its one leaf.
    "config": {
        "algorithms",
        "broker",
        "cli",
        "commands",
        "consumers",
        "data",
        "engines",
        "environments",
        "fleet",
        "models",
        "observability",
        "producers",
        "schemas",
    },
    # DESIGN.md: cli.py discovers commands/; commands never import cli back.
    "commands": {"cli"},
    # Product features moved out of utils/ (issue 19): files on disk and builds for other
    # runtimes, below the roles and the commands that use them.
    "checkpoints": {
        "broker",
        "producers",
        "consumers",
        "fleet",
        "commands",
        "engines",
        "environments",
        "export",
    },
    "export": {"broker", "producers", "consumers", "fleet", "commands", "environments"},
    # Metrics, traces and status files, used by every layer from broker/ up: below all of them.
    "observability": {
        "algorithms",
        "broker",
        "checkpoints",
        "commands",
        "consumers",
        "data",
        "engines",
        "environments",
        "export",
        "fleet",
        "models",
        "producers",
        "schemas",
    },
}


def dockyard_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "dockyard" and node.level == 0:
            names = [f"dockyard.{alias.name}" for alias in node.names]
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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def import_graph() -> nx.DiGraph:
    """dockyard module -> the dockyard modules it imports (``from pkg import submodule`` is an
    import of the submodule; ``from pkg import name`` of the package's ``__init__``)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    for module, path in paths.items():
        graph.add_node(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph.add_edge(module, target)
    return graph


def unit_of(module: str) -> str:
    """The unit a module belongs to: its top-level package (``dockyard.broker.plane`` ->
    ``broker``), except in ``utils``, a set of unrelated helpers where each module or
    subpackage is its own unit (``utils.logging`` is below config, the others need not be)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "utils":
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_the_import_graph_is_read():
    # Guards the checks below against passing on an empty or partial graph.
    graph = import_graph()
    assert graph.has_edge("dockyard.cli", "dockyard.commands._cli")
    assert graph.has_edge("dockyard.broker.plane", "dockyard.broker.dead_letters")
    assert graph.has_edge("dockyard.algorithms.grpo", "dockyard.config.master")


def test_no_module_imports_itself_back_through_others():
    """No cycle between modules: each one can be read knowing only what it imports."""
    assert cycles(import_graph()) == []


def test_no_cycle_between_packages():
    """The top-level packages (and ``cli``) form layers: config <-> algorithms and
    cli <-> commands were such cycles."""
    packages = nx.DiGraph()
    packages.add_nodes_from(unit_of(module) for module in import_graph())
    for importer, imported in import_graph().edges:
        if unit_of(importer) != unit_of(imported):
            packages.add_edge(unit_of(importer), unit_of(imported))
    found = cycles(packages)
    witnesses = {
        f"{a} -> {b}"
        for cycle in found
        for a, b in import_graph().edges
        if unit_of(a) in cycle and unit_of(b) in cycle and unit_of(a) != unit_of(b)
    }
    assert found == [], sorted(witnesses)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("dockyard.broker.plane", "dockyard.broker.dead_letters"),
        ("dockyard.broker.jetstream", "dockyard.broker.exhausted"),
        ("dockyard.config", "dockyard.algorithms"),
        ("dockyard.cli", "dockyard.commands"),
    ],
)
def test_the_cycles_of_issue_19_stay_gone(first, second):
    """Named so that a regression says which one came back (the tests above would catch it
    too, as one of possibly several cycles)."""

    def within(prefix: str) -> set[str]:
        return {m for m in import_graph() if m == prefix or m.startswith(prefix + ".")}

    graph = import_graph()
    there = any(nx.has_path(graph, a, b) for a in within(first) for b in within(second))
    back = any(nx.has_path(graph, b, a) for a in within(first) for b in within(second))
    assert not (there and back), f"{first} and {second} import each other"


#: DESIGN.md / issue 19: roles get the narrow ``DataPlane``; provisioning, purges and the stream
#: survey (``broker.admin``) are the operator's.
ADMIN_MODULE = "dockyard.broker.admin"
ROLE_PACKAGES = ("producers", "consumers")


def test_the_admin_module_is_named_in_the_graph():
    # Guards the check below against passing because the module moved or was renamed.
    assert ADMIN_MODULE in import_graph()
    assert import_graph().has_edge("dockyard.broker.jetstream", ADMIN_MODULE)


@pytest.mark.parametrize("package", ROLE_PACKAGES)
def test_roles_do_not_import_the_admin_plane(package):
    """Directly: a role that only reaches ``AdminPlane`` through a broker module it imports
    (the blob store purging its lease records) cannot call provisioning, purge or the survey
    itself, so only direct imports are refused."""
    graph = import_graph()
    importers = sorted(
        module
        for module in graph.predecessors(ADMIN_MODULE)
        if module.startswith(f"dockyard.{package}.") or module == f"dockyard.{package}"
    )
    assert importers == []
