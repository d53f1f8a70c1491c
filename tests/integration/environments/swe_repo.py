"""A tiny repository with a bug and a unittest suite, and unified diffs against it (SWE tests)."""

from __future__ import annotations

import difflib
from pathlib import Path

from dockyard.environments.swe.protocol import SWEJobRequest, SWEJobResult
from dockyard.environments.swe.service import SWEJobRunner

# The repository the CPU presets ship (configs/cpu/data/swe_repos/calc) is the one built here.
SHIPPED = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "swe_repos" / "calc"
BUGGY = (SHIPPED / "calc" / "__init__.py").read_text()
FIXED = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a * b\n"
TESTS = (SHIPPED / "tests" / "test_calc.py").read_text()
POLICY = (SHIPPED.parents[1] / "swe_policy.yaml").read_text()


def diff(path: str, before: str, after: str) -> str:
    """A ``git diff``-style patch of one file (``before`` empty: the file is created)."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}" if before else "/dev/null",
        tofile=f"b/{path}",
    )
    mode = "" if before else "new file mode 100644\n"
    return f"diff --git a/{path} b/{path}\n{mode}" + "".join(lines)


def make_calc(root: Path, extra_tests: dict[str, str] | None = None) -> Path:
    """``root/calc``: package ``calc`` with the bug, tests in ``tests/``; returns ``root``."""
    package = root / "calc" / "calc"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(BUGGY)
    (root / "calc" / "tests").mkdir()
    (root / "calc" / "tests" / "__init__.py").write_text("")
    (root / "calc" / "tests" / "test_calc.py").write_text(TESTS)
    for name, text in (extra_tests or {}).items():
        (root / "calc" / "tests" / name).write_text(text)
    return root


# Imported before test_calc.py (unittest discovers in sorted order), so product code it imports
# runs before test_calc.py is read.
EARLY_TESTS = """import unittest

import calc


class ImportTest(unittest.TestCase):
    def test_imports(self):
        self.assertTrue(callable(calc.add))
"""
# With the bug: test_imports and test_add_zero pass, test_add fails.
PASSED_WITH_THE_BUG, TOTAL = 2, 3
PASSING_TESTS = """import unittest


class AddTest(unittest.TestCase):
    def test_add(self):
        pass

    def test_add_zero(self):
        pass
"""


def assert_no_reward(result: SWEJobResult) -> None:
    assert result.status in ("failed", "integrity_violation"), result
    assert result.tests_passed <= PASSED_WITH_THE_BUG, result


def score_product(runner: SWEJobRunner, source: str, extra_patch: str = "") -> SWEJobResult:
    """Score a patch that replaces ``calc/__init__.py`` with ``source`` (keeping the bug)."""
    patch = diff("calc/__init__.py", BUGGY, source) + extra_patch
    return runner.run(SWEJobRequest(repo="calc", patch=patch))
