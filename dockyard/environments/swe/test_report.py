"""Judging a test run from the runner's per-test report, never from its output.

The runner (:mod:`dockyard.environments.swe._suite_runner`) writes ``{"outcomes": {id: outcome},
"signals": [str]}`` on its results pipe (``signals``: what it saw the code under test do to fool
it, the service's dynamic reward-hack evidence). A run counts the tests collected from the
pristine snapshot (``expected``) that passed; tests the run did not report count as failed,
tests it reported beyond them are ignored, and the canary (a test the service plants, which
fails on an untampered framework) must have failed. An expected failure counts as passed only
for a test the pristine snapshot marks as expected to fail: ``pytest.xfail()`` called from
product code turns any test "xfailed".
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

# skipped is not a pass: product code can raise SkipTest from inside a test.
_OUTCOMES = frozenset({"passed", "failed", "skipped", "xfailed", "collected", "collected_xfail"})


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


_MAX_SIGNALS, _MAX_SIGNAL_CHARS = 50, 300


@dataclass(frozen=True)
class RunnerReport:
    outcomes: dict[str, str]
    signals: list[str]


def read_report(report: bytes) -> RunnerReport:
    """The outcomes and signals of a runner report (the bytes of its results pipe)."""
    outcomes = read_outcomes(report)
    signals = json.loads(report).get("signals", [])
    if not isinstance(signals, list) or not all(isinstance(item, str) for item in signals):
        raise ReportError("malformed test report: signals")
    return RunnerReport(outcomes, [item[:_MAX_SIGNAL_CHARS] for item in signals[:_MAX_SIGNALS]])


def unexpected_xfails(
    outcomes: dict[str, str], expected: Collection[str], expected_failures: Collection[str]
) -> list[str]:
    """Signals for tests that "failed as expected" though the snapshot expects no failure:
    ``pytest.xfail()`` reached from the code under test."""
    return [
        f"framework_internals: {test} xfailed at run time, unmarked in the snapshot"
        for test in sorted(expected)
        if outcomes.get(test) == "xfailed" and test not in expected_failures
    ]


def read_outcomes(report: bytes) -> dict[str, str]:
    """The ``id -> outcome`` map of a runner report (the bytes of its results pipe)."""
    if not report:
        raise ReportError("the test run wrote no report")
    try:
        data = json.loads(report)
    except ValueError as error:
        raise ReportError(f"unreadable test report: {error}") from None
    outcomes = data.get("outcomes") if isinstance(data, dict) else None
    if not isinstance(outcomes, dict) or not all(
        isinstance(key, str) and value in _OUTCOMES for key, value in outcomes.items()
    ):
        raise ReportError("malformed test report")
    return outcomes


def judge(
    outcomes: dict[str, str],
    expected: Collection[str],
    canary: str,
    expected_failures: Collection[str] = (),
    canary_count: int = 1,
) -> Verdict:
    """Count the expected tests that passed (or, marked so in the snapshot, failed as
    expected); refuse the run if a canary (``canary_count`` of them, their ids holding
    ``canary``) did not run or did not fail."""
    canaries = {test: outcome for test, outcome in outcomes.items() if canary in test}
    passed = sum(
        outcomes.get(test) == "passed"
        or (outcomes.get(test) == "xfailed" and test in expected_failures)
        for test in expected
    )
    if len(canaries) < canary_count:
        return Verdict(passed, len(expected), "a canary test was not run")
    if any(outcome != "failed" for outcome in canaries.values()):
        return Verdict(
            passed, len(expected), "the canary test did not fail: the framework was tampered with"
        )
    return Verdict(passed, len(expected))
