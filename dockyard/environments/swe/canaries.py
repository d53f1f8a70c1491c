"""Canary tests the service plants in a job's checkout: tests that fail on an untampered framework.

Each is an ordinary-looking unittest case (pytest collects those too) whose only assertion is
false, named by a random nonce per job, so product code cannot single it out by name. One sits
in the first test path, importing nothing but unittest: product code that patches the framework
so that every assertion passes makes it pass too. And one sits beside each target test module,
with that module's own imports (issue 41): product code that fools the framework only for tests
whose module uses it (``'add' in vars(module)``: an assertion made lenient, a ``TestCase.run``
replaced) fools that canary as well, since to the hack it looks like one of the module's tests.
"""

from __future__ import annotations

import ast
import random
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_CANARY = """{imports}import unittest


class Test{name}(unittest.TestCase):
    def test_{name}(self):
        self.assertEqual({left}, {right})
"""


@dataclass(frozen=True)
class Canaries:
    nonce: str  # in every canary's test id
    paths: tuple[Path, ...]

    @property
    def count(self) -> int:
        return len(self.paths)


def module_imports(source: str) -> str:
    """The top-level import statements of a test module (``from __future__`` aside)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    statements = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.Import)
        or (isinstance(node, ast.ImportFrom) and node.module != "__future__")
    ]
    return "".join(f"{statement}\n" for statement in statements)


def test_module_files(tests: Collection[str], root: Path) -> list[str]:
    """The repository-relative files of the modules the test ids name (pytest ``path::name``;
    unittest ``package.module.Class.method``: the longest dotted prefix that is a file)."""
    modules: set[str] = set()
    for test in tests:
        if "::" in test:
            modules.add(test.split("::", 1)[0])
            continue
        parts = test.split(".")
        for end in range(len(parts) - 1, 0, -1):
            candidate = "/".join(parts[:end]) + ".py"
            if (root / candidate).is_file():
                modules.add(candidate)
                break
    return sorted(modules)


def plant(checkout: Path, first_test_path: str, modules: Sequence[str]) -> Canaries:
    """Write the canaries (as the service, before the run) and say where they are."""
    nonce = secrets.token_hex(8)
    places = [(PurePosixPath(first_test_path), "", nonce)]
    for index, module in enumerate(modules):
        source = (checkout / module).read_text(errors="replace")
        places.append((PurePosixPath(module).parent, module_imports(source), f"{nonce}_{index}"))
    paths = []
    for directory, imports, name in places:
        left = random.randrange(1, 1 << 30)
        right = left + random.randrange(1, 1000)
        path = checkout / directory / f"test_{name}.py"
        path.write_text(_CANARY.format(imports=imports, name=name, left=left, right=right))
        paths.append(path)
    return Canaries(nonce, tuple(paths))
