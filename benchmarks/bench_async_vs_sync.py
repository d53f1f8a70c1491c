"""Async vs sync GRPO on the same workload and number of steps: wall clock and trainer idle time.

Each case is a real ``dockyard run`` of the quickstart (embedded nats-server, trainer, one rollout
worker, one scorer as separate processes; SFT and validation off so only the GRPO loop is timed).
Two engines:

- **torch**: the real torch engine. On 2 cores, generation and training compete for the CPU, so
  overlap buys little;
- **simulated latency**: the same engine plus a fixed per-token decode latency that costs no CPU
  (what a GPU engine looks like from the trainer's side). Here the pipeline's overlap shows.

Wall clock is measured over steps 2..N from the trainer's own metric timestamps; the idle
fraction is Σ wait-for-data / Σ (wait + train + publish) over the same steps.

    python benchmarks/bench_async_vs_sync.py [--steps 30] [--latency 0.05] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from report import replace_section

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
COMMON = [
    "sft.enabled=false",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "grpo.val_at_end=false",
    "checkpointing.enabled=false",
]
SYNC = [
    "grpo.async_grpo.enabled=false",
    "loss_fn.use_importance_sampling_correction=false",
    "~loss_fn.truncated_importance_sampling_type",
    "~loss_fn.truncated_importance_sampling_ratio",
    "~loss_fn.truncated_importance_sampling_ratio_min",
]


@dataclass(frozen=True)
class Case:
    mode: str
    engine: str
    wall_s: float
    idle_fraction: float
    staleness: float
    dropped: float


def run_case(
    mode: str, engine: str, steps: int, latency: float, env: dict[str, str] | None = None
) -> Case:
    """``env``: variables to add to this process's environment for the run (none: as is)."""
    overrides = [*COMMON, f"grpo.max_num_steps={steps}"]
    if mode == "sync":
        overrides += SYNC
    if engine != "torch":
        overrides.append(f"run.simulated_latency_per_token_s={latency}")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "dockyard",
                "--log-format",
                "json",
                "run",
                "--config",
                str(QUICKSTART),
                *overrides,
                "--run-dir",
                str(run_dir),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=1800,
            env={**os.environ, **env} if env else None,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{mode}/{engine} failed:\n{result.stderr[-2000:]}")
        records = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    steps_records = [r for r in records if "train/reward_mean" in r["metrics"]][1:]
    first, last = steps_records[0], steps_records[-1]
    wall = last["time"] - first["time"]
    wait = sum(r["metrics"]["timing/wait_for_data_s"] for r in steps_records[1:])
    busy = sum(
        r["metrics"]["timing/train_step_s"] + r["metrics"]["timing/publish_weights_s"]
        for r in steps_records[1:]
    )
    return Case(
        mode=mode,
        engine=engine,
        wall_s=wall,
        idle_fraction=wait / (wait + busy),
        staleness=sum(r["metrics"]["staleness/mean"] for r in steps_records) / len(steps_records),
        dropped=last["metrics"]["pipeline/dropped_stale"],
    )


def table(cases: list[Case], steps: int, latency: float) -> list[str]:
    lines = [
        "## Async vs sync GRPO (the end-to-end run)",
        "",
        f"`python benchmarks/bench_async_vs_sync.py --steps {steps} --latency {latency} "
        f"--write-docs` ({date.today()}): the quickstart without SFT or validation, "
        f"{steps} steps of 32 prompts × 16 samples, one rollout worker, one scorer, embedded "
        "nats-server, 2 cores. *simulated* adds a CPU-free decode latency of "
        f"{latency * 1000:.0f} ms per token to the torch engine. Wall clock over steps 2..N.",
        "",
        "| engine | mode | wall clock (s) | async speed-up | trainer idle | mean staleness "
        "| dropped stale |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    by_key = {(c.engine, c.mode): c for c in cases}
    for case in cases:
        sync = by_key[(case.engine, "sync")]
        lines.append(
            f"| {case.engine} | {case.mode} | {case.wall_s:.1f} | "
            f"{sync.wall_s / case.wall_s:.2f}× | {case.idle_fraction:.0%} | "
            f"{case.staleness:.2f} | {case.dropped:.0f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per token")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    cases = [
        run_case(mode, engine, args.steps, args.latency)
        for engine in ("torch", "simulated")
        for mode in ("sync", "async")
    ]
    lines = table(cases, args.steps, args.latency)
    print("\n".join(lines))
    if args.write_docs:
        replace_section("async", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
