"""Judging a test run from the runner's per-test report, never from its output.

The runner (:mod:`dockyard.environments.swe._suite_runner`) writes ``{"outcomes": {id: outcome}}``.
A run counts the tests collected from the pristine snapshot (``expected``) that passed; tests the
run did not report count as failed, tests it reported beyond them are ignored, and the canary
(a test the service plants, which fails on an untampered framework) must have failed.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# xfailed: the test's author expects it to fail, and it did. skipped is not a pass: product code
# can raise SkipTest from inside a test.
_COUNTS_AS_PASSED = frozenset({"passed", "xfailed"})
_OUTCOMES = frozenset({"passed", "failed", "skipped", "xfailed", "collected"})


class ReportError(ValueError):
    """The report is missing or malformed."""


@dataclass(frozen=True)
class Verdict:
    passed: int
    total: int
    tampered: str | None = None  # why the run cannot be trusted, if it cannot

    @property
    def all_passed(self) -> bool:
        return self.tampered is None and self.total > 0 and self.passed == self.total


def read_outcomes(path: Path) -> dict[str, str]:
    """The ``id -> outcome`` map of a runner report."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ReportError("the test run wrote no report") from None
    except (OSError, ValueError) as error:
        raise ReportError(f"unreadable test report: {error}") from None
    outcomes = data.get("outcomes") if isinstance(data, dict) else None
    if not isinstance(outcomes, dict) or not all(
        isinstance(key, str) and value in _OUTCOMES for key, value in outcomes.items()
    ):
        raise ReportError("malformed test report")
    return outcomes


def judge(outcomes: dict[str, str], expected: Collection[str], canary: str) -> Verdict:
    """Count the expected tests that passed; refuse the run if the canary did not fail."""
    canaries = {test: outcome for test, outcome in outcomes.items() if canary in test}
    passed = sum(outcomes.get(test) in _COUNTS_AS_PASSED for test in expected)
    if not canaries:
        return Verdict(passed, len(expected), "the canary test was not run")
    if any(outcome != "failed" for outcome in canaries.values()):
        return Verdict(
            passed, len(expected), "the canary test did not fail: the framework was tampered with"
        )
    return Verdict(passed, len(expected))
