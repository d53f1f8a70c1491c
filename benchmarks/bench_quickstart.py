"""The main job's acceptance numbers: does the quickstart learn, and how long does it take?

Runs ``dockyard run --config configs/quickstart.yaml`` (or reads an existing run directory with
``--run-dir``) and reports the held-out validation accuracy at the start of GRPO (right after
the SFT warm start), at the end, and averaged over the last three evaluations (the evaluation
set has 200 problems: one evaluation has ≈3.4 points of standard error), plus the wall clock.
The target (issue #21): +30 points over GRPO's own starting value, under 2 minutes on 2 cores.
``--in-process`` runs it with ``data_plane=null`` (every role in one process over the in-memory
plane) and reports it in its own subsection, next to the JetStream run.

    python benchmarks/bench_quickstart.py [--run-dir DIR] [--in-process] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml
from report import replace_section

ROOT = Path(__file__).resolve().parents[1]


def accuracies(run_dir: Path) -> tuple[list[tuple[int, float]], dict[str, float]]:
    history, sft = [], {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        metrics = record["metrics"]
        if "val/accuracy" in metrics:
            history.append((record["step"], metrics["val/accuracy"]))
        if "sft/steps" in metrics:
            sft = metrics
    return history, sft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="report an existing run instead")
    parser.add_argument(
        "--in-process", action="store_true", help="data_plane=null: every role in one process"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    wall = cpu = None
    load_at_start = os.getloadavg()[0]
    run_dir = args.run_dir
    if run_dir is None:
        run_dir = Path(tempfile.mkdtemp()) / "quickstart"
        started = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dockyard",
                "run",
                "--config",
                "configs/quickstart.yaml",
                *(["data_plane=null"] if args.in_process else []),
                "--run-dir",
                str(run_dir),
            ],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - started
        # User + system CPU seconds of every process the run started (each role, nats-server:
        # all waited for): what the run costs whatever else shares the cores.
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    history, sft = accuracies(run_dir)
    history = sorted(dict(history).items())  # the end-of-run evaluation repeats the last step
    start = history[0][1]
    final = history[-1][1]
    last_three = [acc for _, acc in history[-3:]]
    mean_last = sum(last_three) / len(last_three)
    # The text describes the run that was measured (its resolved config), not the file's today.
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    grpo, policy = cfg["grpo"], cfg["policy"]
    scheduler = policy["scheduler"]
    decay = (
        f"{scheduler['name']} decay to {scheduler['min_lr_ratio']:g}×"
        if scheduler["name"] != "constant"
        else "constant"
    )
    shape = (
        f"SFT warm start until dev accuracy ≥ {cfg['sft']['stop_at_val_accuracy']}, then "
        f"{grpo['max_num_steps']} async GRPO steps of {grpo['num_prompts_per_step']} prompts × "
        f"{grpo['num_generations_per_prompt']} samples (temperature "
        f"{policy['generation']['temperature']:g}, lr {policy['optimizer']['lr']:g}, "
        f"{scheduler['warmup_steps']} warm-up steps, then {decay}"
        f"{', no separate π_old pass' if policy['skip_prev_logprobs'] else ''}), an evaluation "
        f"every {grpo['val_period']} steps"
    )
    # Other jobs share these cores: the wall clock means little without the load it ran under.
    load = (
        f"; load average {load_at_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end"
        if wall
        else ""
    )
    curve = ", ".join(f"{step}: {acc:.2f}" for step, acc in history[::4])
    if args.in_process:
        heading = ["### In one process (`data_plane: null`)"]
        what = (
            f"`python benchmarks/bench_quickstart.py --in-process --write-docs` ({date.today()}, "
            "2 cores): `dockyard run --config configs/quickstart.yaml data_plane=null` — the "
            "same roles as tasks of one process over one in-memory plane, no broker; "
            f"{shape}."
        )
    else:
        heading = ["## The main job (quickstart)"]
        what = (
            f"`python benchmarks/bench_quickstart.py --write-docs` ({date.today()}, 2 cores): "
            "`dockyard run --config configs/quickstart.yaml` — embedded nats-server, trainer, "
            "one rollout worker, one scorer as separate processes; "
            f"{shape}{load}."
        )
    lines = [
        *heading,
        "",
        what,
        "",
        "| SFT steps | SFT s | val acc at GRPO start | final | mean of last 3 | gain (mean) "
        "| wall clock | CPU s (user+sys) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {sft.get('sft/steps', 0):.0f} | {sft.get('timing/sft_s', 0):.0f} | {start:.3f} "
        f"| {final:.3f} | {mean_last:.3f} | **{(mean_last - start) * 100:+.1f} points** "
        f"| {f'{wall:.0f} s' if wall else 'n/a'} | {f'{cpu:.0f}' if cpu else 'n/a'} |",
        "",
        f"Validation accuracy by step: {curve}.",
    ]
    print("\n".join(lines))
    if args.write_docs:
        # The in-process run is a subsection: rewriting the JetStream run's lead keeps it.
        replace_section("quickstart", lines, subsection=heading[0] if args.in_process else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
