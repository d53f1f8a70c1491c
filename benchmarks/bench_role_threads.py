"""Threads per role in ``dockyard run``: each role's share of the cores against torch's default.

``dockyard run`` starts the trainer, one rollout worker and one scorer as processes on one
machine. Each role gets ``cores // roles`` compute threads (dockyard/fleet/threads.py; 1 on 2
cores); the baseline gives every role torch's default, one thread per core, by setting
``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` to the core count. The workload is the quickstart without
SFT or validation (benchmarks/bench_async_vs_sync.py's async torch case); wall clock per step over
steps 2..N, the two settings alternating round by round in one run.

    python benchmarks/bench_role_threads.py [--steps 6] [--rounds 2] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import date

from bench_async_vs_sync import run_case
from report import replace_section

from dockyard.fleet.threads import THREAD_VARIABLES, available_cpus, threads_per_role

ROLES = 3  # trainer, one rollout worker, one scorer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    cpus = available_cpus()
    settings = {
        f"share ({threads_per_role(cpus, ROLES)} per role)": threads_per_role(cpus, ROLES),
        f"torch default ({cpus} per role)": cpus,
    }
    per_step: dict[str, list[float]] = {name: [] for name in settings}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for name, threads in settings.items():
            env = dict.fromkeys(THREAD_VARIABLES, str(threads))
            case = run_case("async", "torch", args.steps, 0.0, env=env)
            per_step[name].append(case.wall_s / (args.steps - 1))
            load.append(os.getloadavg()[0])
            print(f"{name}: {per_step[name][-1]:.2f} s/step", flush=True)
    share, default = (statistics.median(v) for v in per_step.values())
    lines = [
        "## Threads per role (`dockyard run` on one machine)",
        "",
        f"`python benchmarks/bench_role_threads.py --steps {args.steps} --rounds {args.rounds} "
        f"--write-docs` — {date.today()}, {cpus} CPUs shared with other jobs (load average "
        f"{min(load):.0f}-{max(load):.0f} during the run); the quickstart without SFT or "
        f"validation, {args.steps} async steps of 32 prompts × 16 samples, trainer + rollout "
        "worker + scorer as processes; seconds per step over steps 2..N, median of "
        f"{args.rounds} runs per setting, alternating.",
        "",
        "| threads per role | s/step (each run) | median s/step | vs share |",
        "|---|---|---:|---:|",
    ]
    for name, values in per_step.items():
        median = statistics.median(values)
        lines.append(
            f"| {name} | {', '.join(f'{v:.2f}' for v in values)} | {median:.2f} "
            f"| **{median / share:.2f}×** |"
        )
    lines += [
        "",
        f"Reading: with every role at torch's default the step takes {default / share:.1f}× as "
        "long as with each role's share of the cores.",
    ]
    print("\n".join(lines))
    if args.write_docs:
        replace_section("role-threads", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
