"""Sandbox overhead per code task, against a bare ``python -c pass`` subprocess in the same run.

    python benchmarks/bench_sandbox.py [--runs 30]

Rows (median and p90 of wall milliseconds per run, and the ratio to the bare baseline):
- bare: ``subprocess.run([sandbox_python, "-c", "pass"])`` — the floor for any process-based
  verifier with this interpreter;
- sandboxed pass: ``Sandbox.run_python("pass")`` — session (fresh tmpfs, uid), bubblewrap
  (network, PID, mount, IPC namespaces; the seccomp filter), the run's cgroup, rlimits, setpriv,
  exec, supervision and the kill;
- weak: the same with ``allow_weak_isolation`` on a machine without bubblewrap (stood in for by
  an empty search path): the mechanism before issue #20 — bootstrap-made network namespace,
  rlimits, the uid sweep — the "before" of the isolation work, measured in the same run;
- code task: ``CodeEnvironment.score_program`` on an a+b program with one stdin/stdout test.

Runs of the rows are interleaved (one of each per round), so load drift on a shared machine hits
every row alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable

from dockyard.config.sections.env import CodeEnvConfig, SandboxLimits
from dockyard.environments.code_env import CodeEnvironment, TestCase
from dockyard.environments.sandbox import jail


def _measure(actions: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for action in actions.values():
        action()  # warm-up (page cache, imports)
    for _ in range(runs):
        for name, action in actions.items():
            started = time.perf_counter()
            action()
            samples[name].append((time.perf_counter() - started) * 1000)
    return samples


def _weak_environment() -> CodeEnvironment:
    search_path, jail.BWRAP_SEARCH_PATH = jail.BWRAP_SEARCH_PATH, ""
    try:
        return CodeEnvironment(CodeEnvConfig(limits=SandboxLimits(allow_weak_isolation=True)))
    finally:
        jail.BWRAP_SEARCH_PATH = search_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    environment, weak = CodeEnvironment(CodeEnvConfig()), _weak_environment()
    sandbox = environment.sandbox
    program = "a, b = map(int, input().split())\nprint(a + b)\n"
    case = [TestCase("2 3\n", "5\n")]

    def code_task(env: CodeEnvironment) -> Callable[[], None]:
        def run() -> None:
            score = env.score_program(program, case)
            assert score.reward == 1.0, score.detail

        return run

    rows = _measure(
        {
            "bare python -c pass": lambda: subprocess.run(
                [sandbox.python, "-c", "pass"], check=True
            ),
            "weak pass (before)": lambda: weak.sandbox.run_python("pass"),
            "sandboxed pass": lambda: sandbox.run_python("pass"),
            "weak code task": code_task(weak),
            "code task (1 test)": code_task(environment),
        },
        args.runs,
    )
    baseline = statistics.median(rows["bare python -c pass"])
    isolation = sandbox.run_python("pass").isolation
    print(
        f"python={sandbox.python} runs={args.runs} cpus={os.cpu_count()} "
        f"network={isolation.network} own_uid={isolation.privileges_dropped} "
        f"namespaces={isolation.namespaces} cgroup={isolation.cgroup}"
    )
    print(f"{'run':<22} {'median ms':>10} {'p90 ms':>8} {'vs bare':>8} {'overhead ms':>12}")
    overhead = {}
    for name, samples in rows.items():
        median = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        overhead[name] = median - baseline
        print(
            f"{name:<22} {median:>10.1f} {p90:>8.1f} {median / baseline:>7.2f}x "
            f"{median - baseline:>12.1f}"
        )
    pairs = (("sandboxed pass", "weak pass (before)"), ("code task (1 test)", "weak code task"))
    for strong, before in pairs:
        ratio = overhead[strong] / overhead[before]
        print(f"overhead {strong} / {before}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
