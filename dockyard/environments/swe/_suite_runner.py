"""Runs a repository's tests inside the sandbox and writes each test's outcome to a JSON report.

Stdlib only (pytest is imported only for ``--framework pytest``). The sandbox service copies
this file next to the checkout (never into it) and starts it as
``python -I _suite_runner.py --framework F --mode collect|run --checkout DIR --report FILE --
TEST_PATH...``. Why it is built this way (the scoring threat model in docs/operations.md):

- ``-I`` (isolated mode, with 3.11's safe path): neither the script's directory nor the current
  directory nor ``PYTHON*`` variables nor user site-packages reach ``sys.path``. The test
  framework is imported *before* the checkout is put on ``sys.path``, and the checkout is
  *appended*, so a ``unittest.py``, ``pytest.py`` or any stdlib-named module in a patch can never
  shadow the runner, the framework or anything either imports later.
- The outcome of every test is recorded through the runner's own result hooks, by test id, and
  written to the report file named by the service, never parsed from output the code under test
  can print to. The report is written last and the process leaves with ``os._exit``, so
  ``atexit`` handlers of the code under test never run after it.
- The service compares the ids against those collected from the pristine snapshot and checks
  that its canary test failed: product code that patches the framework so that assertions pass
  makes the canary pass too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import unittest
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the runner imports pytest lazily (--framework pytest)
    import pytest

PASSED, FAILED, SKIPPED, XFAILED = "passed", "failed", "skipped", "xfailed"

# What unittest hands a result hook for a failure: sys.exc_info() of the failing test.
_ErrInfo = tuple[type[BaseException], BaseException, object] | tuple[None, None, None]


def _leaves(suite: Iterable[object]) -> Iterator[object]:
    for item in suite:
        if isinstance(item, Iterable):
            yield from _leaves(item)
        else:
            yield item


def _run_unittest(checkout: str, paths: list[str], collect: bool) -> dict[str, str]:
    class Recorder(unittest.TestResult):
        """Outcome per test id; a failure (of the test or one of its subtests) is final."""

        def __init__(self) -> None:
            super().__init__()
            self.outcomes: dict[str, str] = {}

        def _set(self, test: unittest.TestCase, outcome: str) -> None:
            if self.outcomes.get(test.id()) != FAILED:
                self.outcomes[test.id()] = outcome

        def addSuccess(self, test: unittest.TestCase) -> None:
            self._set(test, PASSED)

        def addFailure(self, test: unittest.TestCase, err: _ErrInfo) -> None:
            self._set(test, FAILED)

        def addError(self, test: unittest.TestCase, err: _ErrInfo) -> None:
            self._set(test, FAILED)

        def addSkip(self, test: unittest.TestCase, reason: str) -> None:
            self._set(test, SKIPPED)

        def addExpectedFailure(self, test: unittest.TestCase, err: _ErrInfo) -> None:
            self._set(test, XFAILED)

        def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
            self._set(test, FAILED)

        def addSubTest(
            self, test: unittest.TestCase, subtest: unittest.TestCase, err: _ErrInfo | None
        ) -> None:
            if err is not None:
                self._set(test, FAILED)

    _append_checkout(checkout)
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(
        loader.discover(os.path.join(checkout, path), top_level_dir=checkout) for path in paths
    )
    if collect:
        # A module that failed to import is collected as a stand-in test: report it as failed.
        return {
            test.id(): FAILED
            if isinstance(test, unittest.loader._FailedTest)  # type: ignore[attr-defined]  # private class, absent from typeshed, the only mark of a failed import
            else "collected"
            for test in _leaves(suite)
            if isinstance(test, unittest.TestCase)
        }
    recorder = Recorder()
    suite.run(recorder)
    return recorder.outcomes


def _run_pytest(checkout: str, paths: list[str], collect: bool) -> dict[str, str]:
    import pytest

    class Recorder:
        """pytest plugin: outcome per node id from the setup/call/teardown reports."""

        def __init__(self) -> None:
            self.outcomes: dict[str, str] = {}

        def pytest_collection_finish(self, session: pytest.Session) -> None:
            if collect:
                self.outcomes.update({item.nodeid: "collected" for item in session.items})

        def pytest_collectreport(self, report: pytest.CollectReport) -> None:
            if report.failed:
                self.outcomes[report.nodeid] = FAILED

        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if self.outcomes.get(report.nodeid) == FAILED:
                return
            if report.failed:
                self.outcomes[report.nodeid] = FAILED
            elif report.skipped:
                self.outcomes[report.nodeid] = XFAILED if hasattr(report, "wasxfail") else SKIPPED
            elif report.when == "call":
                # A passing call of an xfail test is an unexpected success.
                self.outcomes[report.nodeid] = FAILED if hasattr(report, "wasxfail") else PASSED

    _append_checkout(checkout)
    recorder = Recorder()
    arguments = [
        *(os.path.join(checkout, path) for path in paths),
        "--rootdir",
        checkout,
        "--import-mode=append",  # never put a checkout directory in front of sys.path
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    if collect:
        arguments.append("--collect-only")
    pytest.main(arguments, plugins=[recorder])
    return recorder.outcomes


def _append_checkout(checkout: str) -> None:
    # After everything the runner and the framework import: the checkout only adds modules.
    if checkout not in sys.path:
        sys.path.append(checkout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=("unittest", "pytest"), required=True)
    parser.add_argument("--mode", choices=("collect", "run"), required=True)
    parser.add_argument("--checkout", required=True)
    parser.add_argument("--report", required=True)
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    run = _run_unittest if args.framework == "unittest" else _run_pytest
    outcomes: dict[str, str] = run(args.checkout, args.paths, args.mode == "collect")
    data = json.dumps({"outcomes": outcomes}).encode()
    descriptor = os.open(args.report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as report:
        report.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit handler of the code under test runs after the report


if __name__ == "__main__":
    main()
