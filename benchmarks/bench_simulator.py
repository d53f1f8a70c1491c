"""The fleet simulator against measured runs: calibrate on one, predict the others.

    python benchmarks/bench_simulator.py [--runs DIR ...] [--steps 30] [--reuse] [--write-docs]

Three small quickstart runs (tests/integration/e2e/conftest.py's SMALL_RUN sizes, no SFT, no
validation) on this machine: async with one rollout worker (the calibration run), async with two
workers and sync with one (the validation runs). The stage costs are measured from the first
run (``dockyard.planning.calibration``); each other run is then simulated with its own rules and
fleet and the prediction is compared with what the run measured: steps/s, trainer idle
fraction, mean staleness. The baseline of each row is the measured run of the same session.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

from dockyard.algorithms.grpo import registered_names
from dockyard.config.loader import load_config_report
from dockyard.planning.calibration import calibrate, measured_run
from dockyard.planning.fleet import FleetSpec, pipeline_rules, rollout_bytes_bound
from dockyard.planning.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import replace_section

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "sft.enabled=false",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
    "grpo.val_at_start=false",
    "grpo.val_at_end=false",
    "grpo.val_period=1000",
    "checkpointing.save_period=1000",
    "checkpointing.keep_top_k=null",
]
RUNS = {
    "w1": ["run.num_rollout_workers=1"],  # calibration
    "w2": ["run.num_rollout_workers=2"],
    "s1": ["run.num_rollout_workers=1", "grpo.async_grpo.enabled=false"],
}
LABELS = {
    "w1": "async, 1 worker",
    "w2": "async, 2 workers",
    "s1": "sync, 1 worker",
}


def make_run(run_dir: Path, extra: list[str], steps: int) -> None:
    command = [sys.executable, "-m", "dockyard", "--log-format", "json", "run"]
    command += ["--config", "configs/quickstart.yaml", "--run-dir", str(run_dir)]
    command += [*SMALL, f"grpo.max_num_steps={steps}", *extra]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env=os.environ.copy())


def run_config(run_dir: Path):
    return load_config_report(
        str(run_dir / "config.yaml"), [], registered=registered_names()
    ).config


#: (calibration run, cores its roles shared in the simulation): each its own table.
CALIBRATIONS = [("w1", None), ("s1", 1)]


def table(runs: Path, base: str, cores: int | None, session: int) -> tuple[str, str, list[str]]:
    base_config = run_config(runs / base)
    costs = calibrate(
        runs / base,
        rules=pipeline_rules(base_config),
        workers=base_config.run.num_rollout_workers,
        scorers=base_config.run.num_scorers,
        rollout_bytes=rollout_bytes_bound(base_config),
        shared_cores=cores,
    )
    where = f"all roles on {cores} shared core(s)" if cores else "each role on its own hardware"
    title = f"Session {session}: calibrated on {LABELS[base]}; simulated with {where}"
    fitted = "Costs (s): " + ", ".join(
        f"{k} {v:.4g}" for k, v in dataclasses.asdict(costs).items() if not k.endswith("_bytes")
    )
    rows = [
        "| run | steps/s measured | predicted | error | idle measured | predicted | "
        "staleness mean measured | predicted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in RUNS:
        config = run_config(runs / name)
        measured = measured_run(runs / name)
        spec = FleetSpec(
            pipeline_rules(config),
            costs,
            workers=config.run.num_rollout_workers,
            scorers_per_site=config.run.num_scorers,
            shared_cores=cores,
        )
        p = simulate(spec)
        ages = measured.staleness
        m_stale = sum(a * n for a, n in ages.items()) / sum(ages.values())
        label = LABELS[name] if name != base else f"{LABELS[name]} (calibration)"
        rows.append(
            f"| {label} | {measured.steps_per_s:.2f} | {p.steps_per_s:.2f} | "
            f"{error(p.steps_per_s, measured.steps_per_s)} | "
            f"{measured.trainer_idle_fraction:.2f} | {p.trainer_idle_fraction:.2f} | "
            f"{m_stale:.2f} | {p.staleness_mean:.2f} |"
        )
    return title, fitted, rows


def error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured * 100:+.0f}%" if measured else "–"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs",
        type=Path,
        nargs="+",
        default=[Path("/tmp/dockyard-bench-simulator")],
        help="one directory per session of three runs (sessions at different times show how "
        "much the machine's load moves the numbers)",
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--reuse", action="store_true", help="use runs already in --runs")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    for name, extra in RUNS.items():
        for runs in args.runs:
            if not (args.reuse and (runs / name / "metrics.jsonl").exists()):
                make_run(runs / name, extra, args.steps)
    print(f"load average: {os.getloadavg()}")
    tables = [
        table(runs, base, cores, session)
        for session, runs in enumerate(args.runs, start=1)
        for base, cores in CALIBRATIONS
    ]
    for title, fitted, lines in tables:
        print(f"\n{title}\n{fitted}\n" + "\n".join(lines))
    if args.write_docs:
        lines = [
            "## Fleet simulator against measured runs",
            "",
            f"`python benchmarks/bench_simulator.py --steps {args.steps} --write-docs` — "
            f"{date.today().isoformat()}, this machine (2 CPU cores shared with other jobs, "
            f"load average {os.getloadavg()[0]:.1f} when this was written). Three quickstart "
            f"runs of {args.steps} steps (4 groups × 4 samples per step, no SFT, no "
            "validation, embedded nats-server, one scorer). Stage costs are measured from "
            "one run (medians of steps 2..N; `hop_s`, the one cost no log records, fitted so "
            "the simulated calibration run makes its measured steps/s, or 0 when the run was "
            "faster than the simulation without it), then each run is simulated with its own "
            "rules and fleet and compared with what it measured. Rates over the steady state "
            "(end of step 1 to the end); idle = the trainer's `timing/wait_for_data_s` over "
            "that time; error = predicted ÷ measured − 1.",
            "",
            READING,
        ]
        replace_section("fleet-simulator", lines)
        for title, fitted, rows in tables:
            heading = f"### {title}"
            replace_section("fleet-simulator", [heading, "", fitted, "", *rows], subsection=heading)
    return 0


READING = (
    "Reading: staleness follows from the rules alone and is predicted exactly in every run. "
    "Throughput is predicted only as well as the stage costs transfer from the calibration "
    "run to the others, and on this machine they do not transfer well: every role shares two "
    "cores with other jobs whose load moves between runs a minute apart (compare the two "
    "sessions: the sync run made 3.4 steps/s in one and 7.0 in the other, its train step took "
    "0.126 s and 0.055 s). Within a session, the async run with two workers is predicted "
    "within about 5-11% from the async run with one, but the other configuration (sync) is "
    "off by 20-70%, and the idle fraction with two workers is overestimated (here the second "
    "worker slowed the trainer down rather than feeding it, which a model of separate "
    "hardware cannot show). Simulating all roles on one shared core does not fix this: it "
    "helps in one session and hurts in the other. For planning: calibrate on the hardware of "
    "the fleet with the roles where they will run (a run on one GPU node measures that node's "
    "generation and step times), and take these one-machine errors as the bound of what this "
    "page shows, not as the model's error on dedicated hardware, which could not be measured "
    "here."
)

if __name__ == "__main__":
    sys.exit(main())
