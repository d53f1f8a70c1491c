"""Sandbox overhead per code task, against a bare ``python -c pass`` subprocess in the same run.

    python benchmarks/bench_sandbox.py [--runs 30]

Rows (median and p90 of wall milliseconds per run, and the ratio to the bare baseline):
- bare: ``subprocess.run([sandbox_python, "-c", "pass"])`` — the floor for any process-based
  verifier with this interpreter;
- sandboxed pass: ``Sandbox.run_python("pass")`` — session (fresh directory, uid), bootstrap
  (namespace, rlimits, setuid), exec, supervision and the kill sweep;
- code task: ``CodeEnvironment.score_program`` on an a+b program with one stdin/stdout test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable

from dockyard.config.sections.env import CodeEnvConfig
from dockyard.environments.code_env import CodeEnvironment, TestCase


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
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    environment = CodeEnvironment(CodeEnvConfig())
    sandbox = environment.sandbox
    program = "a, b = map(int, input().split())\nprint(a + b)\n"
    case = [TestCase("2 3\n", "5\n")]

    def code_task() -> None:
        score = environment.score_program(program, case)
        assert score.reward == 1.0, score.detail

    rows = {
        "bare python -c pass": _measure(
            lambda: subprocess.run([sandbox.python, "-c", "pass"], check=True), args.runs
        ),
        "sandboxed pass": _measure(lambda: sandbox.run_python("pass"), args.runs),
        "code task (1 test)": _measure(code_task, args.runs),
    }
    baseline = statistics.median(rows["bare python -c pass"])
    isolation = sandbox.run_python("pass").isolation
    print(
        f"python={sandbox.python} runs={args.runs} cpus={os.cpu_count()} "
        f"network={isolation.network} own_uid={isolation.privileges_dropped}"
    )
    print(f"{'run':<22} {'median ms':>10} {'p90 ms':>8} {'vs bare':>8} {'overhead ms':>12}")
    for name, samples in rows.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(
            f"{name:<22} {median:>10.1f} {p90:>8.1f} {median / baseline:>7.2f}x "
            f"{median - baseline:>12.1f}"
        )


if __name__ == "__main__":
    main()
