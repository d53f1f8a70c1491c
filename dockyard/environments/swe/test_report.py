"""Test counts from a runner's output (unittest and pytest summaries)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
_UNITTEST_FAILED = re.compile(r"^FAILED \(([^)]*)\)", re.MULTILINE)
_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|xpassed|xfailed|skipped)\b")


@dataclass(frozen=True)
class TestCounts:
    passed: int
    total: int


def parse_test_counts(output: str) -> TestCounts | None:
    """Counts from the last summary in ``output``; None if no summary was found."""
    runs = _UNITTEST_RAN.findall(output)
    if runs:
        total = int(runs[-1])
        failed = 0
        failures = _UNITTEST_FAILED.findall(output)
        if failures:
            for item in failures[-1].split(","):
                key, _, value = item.strip().partition("=")
                if key in ("failures", "errors", "unexpected_successes") and value.isdigit():
                    failed += int(value)
        return TestCounts(passed=max(total - failed, 0), total=total)
    summary_lines = [line for line in output.splitlines() if _PYTEST_COUNT.search(line)]
    if not summary_lines:
        return None
    counts = {kind: int(n) for n, kind in _PYTEST_COUNT.findall(summary_lines[-1])}
    passed = counts.get("passed", 0) + counts.get("xfailed", 0)
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    failed += counts.get("xpassed", 0)
    return TestCounts(passed=passed, total=passed + failed)
