"""Per-job cost of SWE scoring: this build's job against the previous flow, in the same run.

    python benchmarks/bench_swe_scoring.py [--runs 20]

A repository like the tests' (a package with a bug, two unittest tests) and a patch that fixes
it. Rows (median and p90 of wall milliseconds per job, and the ratio to the previous flow):
- previous flow: what the service did before issue #20, rebuilt from the same sandbox parts —
  copy the snapshot, hash the protected files, ``git apply``, ``python -m unittest discover``
  in the checkout (its summary would have been parsed from stdout), hash again;
- this build: :meth:`SWEJobRunner.run` — copy, ``git apply``, compare the protected files with
  the snapshot, plant the canary, lock the protected files (as root), run ``_suite_runner.py``
  under ``python -I -B``, read the per-test report, compare again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/integration/environments"))

from swe_repo import BUGGY, FIXED, diff, make_calc

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.swe.integrity import hash_protected_files
from dockyard.environments.swe.policy import RepoPolicy, ServicePolicy
from dockyard.environments.swe.protocol import SWEJobRequest
from dockyard.environments.swe.service import SWEJobRunner


def _measure(action: Callable[[], object], runs: int) -> list[float]:
    action()  # warm-up (page cache, imports)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    repos = make_calc(Path(tempfile.mkdtemp(prefix="bench-swe-")))
    try:
        runner = SWEJobRunner(
            repos,
            SandboxLimits(wall_time_s=60),
            ServicePolicy(repos={"calc": RepoPolicy(framework="unittest")}),
        )
        patch = diff("calc/__init__.py", BUGGY, FIXED)
        patterns = runner.baselines["calc"].policy.protected_patterns()
        command = [runner.sandbox.python, "-m", "unittest", "discover", "-s", "tests", "-t", "."]

        def previous_flow() -> None:
            with runner.sandbox.session() as session:
                checkout = session.directory / "repo"
                shutil.copytree(repos / "calc", checkout, symlinks=True)
                session.give_to_sandbox(checkout)
                before = hash_protected_files(checkout, patterns)
                patch_file = session.write_file("change.diff", patch.encode())
                applied = session.run(
                    [runner.git, "apply", str(patch_file)],
                    cwd=checkout,
                    env={"GIT_CEILING_DIRECTORIES": str(session.directory)},
                )
                assert applied.ok, applied.stderr
                tests = session.run(command, cwd=checkout)
                assert tests.returncode == 0, tests.stderr
                assert before == hash_protected_files(checkout, patterns)

        def this_build() -> None:
            result = runner.run(SWEJobRequest(repo="calc", patch=patch))
            assert result.status == "passed", result

        rows = {
            "previous flow": _measure(previous_flow, args.runs),
            "this build": _measure(this_build, args.runs),
        }
    finally:
        shutil.rmtree(repos, ignore_errors=True)
    baseline = statistics.median(rows["previous flow"])
    print(
        f"python={runner.sandbox.python} runs={args.runs} cpus={os.cpu_count()} "
        f"root={os.geteuid() == 0}"
    )
    print(f"{'job':<16} {'median ms':>10} {'p90 ms':>8} {'vs previous':>12}")
    for name, samples in rows.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(f"{name:<16} {median:>10.1f} {p90:>8.1f} {median / baseline:>11.2f}x")


if __name__ == "__main__":
    main()
