"""GPU check, measurement 3: the quickstart end to end, its trainer and rollout worker on cuda.

``dockyard run --config configs/quickstart.yaml`` (embedded nats-server, trainer, one rollout
worker with the **torch** engine, one scorer, as processes) with ``policy.precision=bfloat16``
and fewer GRPO steps. vLLM is not used: its CUDA wheel is too large to carry to a machine with
no network, and the quickstart's engine is the torch one anyway. Steps/s are GRPO steps over
the steady state (the first step's end to the last's, from metrics.jsonl's ``time``), against
the CPU figure of docs/benchmarks.md ("The main job"): 180 steps in ≈ 86 s after ≈ 28 s of
start and SFT, ≈ 2.1 steps/s on 2 cores. The trainer's ``trainer.placement`` log line must name
the device the run was meant for (cuda:0; cpu in the dry run).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpu_check_common import sizes, write_row

ROOT = Path(__file__).resolve().parents[1]
#: docs/benchmarks.md, the quickstart: 180 GRPO steps in 114 s wall, ≈ 28 s of it before the
#: first step (role start-up and the SFT warm start).
CPU_STEPS_PER_S = 180 / (114 - 28)

#: The dry run checks the path in seconds: no SFT warm start, no validation.
DRY_OVERRIDES = ["sft.enabled=false", "grpo.val_at_start=false", "grpo.val_at_end=false"]


def steps_per_second(run_dir: Path) -> tuple[int, float]:
    records = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    steps = [r for r in records if "timing/train_step_s" in r.get("metrics", {})]
    if len(steps) < 2:
        raise RuntimeError(f"{run_dir}/metrics.jsonl: fewer than 2 training steps")
    return len(steps), (len(steps) - 1) / (steps[-1]["time"] - steps[0]["time"])


def trainer_device(run_dir: Path) -> str | None:
    for path in sorted((run_dir / "logs").glob("*.log")):
        for line in path.read_text().splitlines():
            if '"trainer.placement"' in line:
                return str(json.loads(line).get("device"))
    return None


def run(results: Path, dry_run: bool) -> None:
    size = sizes(dry_run)
    run_dir = results / "quickstart-run"
    command = [
        sys.executable,
        "-m",
        "dockyard",
        "run",
        "--config",
        "configs/quickstart.yaml",
        "--run-dir",
        str(run_dir),
        f"grpo.max_num_steps={size.quickstart_steps}",
        "policy.precision=bfloat16",
        *(DRY_OVERRIDES if dry_run else []),
    ]
    started = time.perf_counter()
    with (results / "quickstart.log").open("w") as log:
        subprocess.run(command, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    steps, rate = steps_per_second(run_dir)
    placed = trainer_device(run_dir)
    expected = "cpu" if dry_run else "cuda:0"
    write_row(
        results,
        "quickstart",
        steps=steps,
        wall_s=wall,
        steps_per_s=rate,
        cpu_steps_per_s=CPU_STEPS_PER_S,
        vs_cpu=rate / CPU_STEPS_PER_S,
        trainer_device=placed,
        expected_device=expected,
        engine="torch",
        command=" ".join(command[1:]),
    )
    if placed != expected:
        raise RuntimeError(f"the trainer ran on {placed}, not {expected}")
