"""Where the suite's time goes, printed at the end of every run (the conftest's hooks call this).

- Tests over :data:`SLOW_THRESHOLD_S` (setup + call + teardown) that are not marked ``slow``:
  the fast loop (``pytest -m "not slow"``) stays fast only while every such test is marked.
- The slowest test files, summed over their tests, so a file whose many small tests add up shows
  too.

Durations come from pytest's own reports, so the figures are the ones ``--durations`` prints; with
pytest-xdist the controller sees every worker's reports.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest

SLOW_THRESHOLD_S = 5.0
SLOWEST_FILES_SHOWN = 15


@dataclass
class SuiteTiming:
    seconds_by_test: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    marked_slow: set[str] = field(default_factory=set)

    def record(self, report: pytest.TestReport) -> None:
        self.seconds_by_test[report.nodeid] += report.duration
        if "slow" in report.keywords:
            self.marked_slow.add(report.nodeid)

    def unmarked_slow(self) -> list[tuple[str, float]]:
        return sorted(
            (
                (nodeid, seconds)
                for nodeid, seconds in self.seconds_by_test.items()
                if seconds > SLOW_THRESHOLD_S and nodeid not in self.marked_slow
            ),
            key=lambda item: -item[1],
        )

    def seconds_by_file(self) -> list[tuple[str, float, int]]:
        totals: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for nodeid, seconds in self.seconds_by_test.items():
            path = nodeid.split("::", 1)[0]
            totals[path] += seconds
            counts[path] += 1
        return sorted(
            ((path, seconds, counts[path]) for path, seconds in totals.items()),
            key=lambda item: -item[1],
        )

    def write_summary(self, terminal: pytest.TerminalReporter) -> None:
        files = self.seconds_by_file()
        if files:
            terminal.write_sep("=", f"slowest {min(len(files), SLOWEST_FILES_SHOWN)} test files")
            for path, seconds, count in files[:SLOWEST_FILES_SHOWN]:
                terminal.write_line(f"{seconds:9.1f}s  {count:4d} tests  {path}")
            total = sum(seconds for _, seconds, _ in files)
            terminal.write_line(f"{total:9.1f}s  in all test phases (summed over workers)")
        unmarked = self.unmarked_slow()
        if unmarked:
            terminal.write_sep(
                "=", f"{len(unmarked)} tests over {SLOW_THRESHOLD_S:.0f} s not marked slow"
            )
            for nodeid, seconds in unmarked:
                terminal.write_line(f"{seconds:7.1f}s  {nodeid}")
            terminal.write_line(
                "mark them @pytest.mark.slow (or make them faster): "
                "the fast loop, pytest -m 'not slow', runs them"
            )
