"""Where the test suite's time goes: per-file and per-kind tables from pytest junit reports.

    python -m pytest -q --junitxml=after.xml
    python scripts/suite_durations.py after.xml [--before before.xml] [--top 30]

A junit report holds every test's time (setup + call + teardown, as pytest measures it). Files
are summed; each file is put in one *kind* by what it starts (the first rule of
:data:`KINDS` that matches its path), so the kinds are an attribution by file, not a profile.
Prints Markdown for docs/development.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

#: (kind, pattern over the test file's path): what dominates the files of each kind.
KINDS: tuple[tuple[str, str], ...] = (
    ("mypy (strict type check)", r"tests/unit/test_type_check\.py"),
    ("vLLM engines and servers", r"vllm|test_env_gdpval|test_teacher_server"),
    ("fleet runs (`dockyard run` and role processes)", r"tests/integration/e2e/"),
    ("torchrun worlds (gloo ranks)", r"parallel|trainer_ranks|test_launch_ranks"),
    ("llama.cpp and GGUF export", r"tests/integration/export/"),
    ("sandbox and SWE service", r"sandbox|swe|terminal|gdpval|tool_service|osworld"),
    ("nats-server (broker and roles)", r"tests/integration/(broker|roles|dashboard)/"),
    ("JAX backend", r"jax"),
    ("unit tests (in-process)", r"tests/unit/"),
    ("other", r"."),
)


def file_seconds(report: Path) -> tuple[dict[str, float], dict[str, int], float]:
    """Seconds and test count per test file, and the report's own wall clock."""
    root = ElementTree.parse(report).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        path = _path_of(classname, case.get("file"))
        seconds[path] += float(case.get("time", 0) or 0)
        counts[path] += 1
    wall = sum(float(s.get("time", 0) or 0) for s in suites)
    return seconds, counts, wall


def _path_of(classname: str, file: str | None) -> str:
    if file:
        return file
    # "tests.unit.x.test_y" or "tests.unit.x.test_y.TestClass": the module is the test_ part.
    parts = classname.split(".")
    for index in range(len(parts), 0, -1):
        if parts[index - 1].startswith("test_"):
            return "/".join(parts[:index]) + ".py"
    return "/".join(parts) + ".py"


def kind_of(path: str) -> str:
    return next(kind for kind, pattern in KINDS if re.search(pattern, path))


def by_kind(seconds: dict[str, float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for path, value in seconds.items():
        totals[kind_of(path)] += value
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    after, counts, wall = file_seconds(args.report)
    before: dict[str, float] = {}
    total = sum(after.values())
    print(f"Tests' own time {total:.0f} s; the report's wall clock {wall:.0f} s.")
    if args.before is not None:
        before, _, before_wall = file_seconds(args.before)
        print(f"Before: {sum(before.values()):.0f} s; its wall clock {before_wall:.0f} s.")
    print()
    head = "| kind | seconds | share |" + (" before |" if before else "")
    print(head)
    print("|---|---:|---:|" + ("---:|" if before else ""))
    kinds_before = by_kind(before)
    for kind, value in sorted(by_kind(after).items(), key=lambda item: -item[1]):
        row = f"| {kind} | {value:.0f} | {value / total:.0%} |"
        print(row + (f" {kinds_before.get(kind, 0):.0f} |" if before else ""))
    print()
    print("| test file | tests | seconds |" + (" before |" if before else ""))
    print("|---|---:|---:|" + ("---:|" if before else ""))
    for path, value in sorted(after.items(), key=lambda item: -item[1])[: args.top]:
        row = f"| `{path}` | {counts[path]} | {value:.1f} |"
        print(row + (f" {before.get(path, 0):.1f} |" if before else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
