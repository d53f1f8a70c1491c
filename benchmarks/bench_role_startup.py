"""Role start-up: seconds from a role's process start until it can work, for each quickstart role.

Each round starts a fresh namespace on one embedded nats-server, then, one after the other, the
trainer (ready: its status leaves ``starting``, its model built and first weights published), a
scorer (ready: ``running``, consuming rollouts) and a rollout worker (ready: ``running``, its
engine loaded and the trainer's first weights in), each a ``python -m dockyard`` process as
``dockyard run`` starts it; then stops them. The quickstart without its supervised warm start
and first validation (work, not start-up). Baselines measured in the same run: a bare interpreter
and ``import torch, transformers``. ``--before TREE`` measures a second checkout (e.g. the commit
before a change) in the same rounds, alternating, through ``PYTHONPATH``.

    python benchmarks/bench_role_startup.py [--rounds 3] [--before /path/to/old/checkout] \
        [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import date
from pathlib import Path

from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.observability.status_files import STARTING, read_statuses

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
ROLE_ARGS = {
    "trainer": ["trainer"],
    "scorer": ["score", "--scorer-id", "s0"],
    "rollout": ["rollout", "--worker-id", "w0"],
}
OVERRIDES = ["sft.enabled=false", "grpo.val_at_start=false", "grpo.max_num_steps=1000"]
READY_TIMEOUT_S = 300


def _environment(tree: Path | None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def _cwd(tree: Path | None) -> Path:
    """``python -m`` puts the working directory first on sys.path, before PYTHONPATH: a
    checkout's roles must start in it to import its own code."""
    return tree or ROOT


def _seconds_of(command: list[str], env: dict[str, str], tree: Path | None) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, cwd=_cwd(tree), check=True, capture_output=True)
    return time.perf_counter() - start


def _ready(status_dir: Path, role: str) -> bool:
    if not status_dir.exists():
        return False
    return any(s.role == role and s.state != STARTING for s in read_statuses(status_dir))


def _round(url: str, work: Path, env: dict[str, str], tree: Path | None) -> dict[str, float]:
    """Start the trainer, a scorer and a rollout worker in turn; each one's start-up seconds."""
    namespace = f"b{uuid.uuid4().hex[:10]}"
    status_dir, run_dir = work / f"status-{namespace}", work / f"run-{namespace}"
    common = [
        "--config",
        str(QUICKSTART),
        *OVERRIDES,
        f"data_plane.url={url}",
        f"data_plane.namespace={namespace}",
        f"run.output_dir={work}",
        "--status-dir",
        str(status_dir),
    ]
    seconds: dict[str, float] = {}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for role, args in ROLE_ARGS.items():
            extra = ["--run-dir", str(run_dir)] if role == "trainer" else []
            start = time.perf_counter()
            log = (work / f"{namespace}-{role}.log").open("wb")
            processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "dockyard",
                        "--log-format",
                        "json",
                        *args,
                        *common,
                        *extra,
                    ],
                    env=env,
                    cwd=_cwd(tree),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            while not _ready(status_dir, role):
                if processes[-1].poll() is not None:
                    raise RuntimeError(f"{role} exited with {processes[-1].returncode}: {log.name}")
                if time.perf_counter() - start > READY_TIMEOUT_S:
                    raise RuntimeError(f"{role} not ready in {READY_TIMEOUT_S} s: {log.name}")
                time.sleep(0.05)
            seconds[role] = time.perf_counter() - start
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, default=None, help="a second checkout to compare")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"this checkout": None}
    if args.before is not None:
        trees["before"] = args.before.resolve()
    measured: dict[str, dict[str, list[float]]] = {
        name: {key: [] for key in ("python", "torch+transformers", *ROLE_ARGS)} for name in trees
    }
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=work / "nats"))
        url = server.start()
        try:
            for round_index in range(args.rounds):
                for name, tree in trees.items():
                    env = _environment(tree)
                    row = measured[name]
                    row["python"].append(_seconds_of([sys.executable, "-c", "pass"], env, tree))
                    row["torch+transformers"].append(
                        _seconds_of([sys.executable, "-c", "import torch, transformers"], env, tree)
                    )
                    for role, seconds in _round(url, work, env, tree).items():
                        row[role].append(seconds)
                    load.append(os.getloadavg()[0])
                    print(
                        f"round {round_index + 1} {name}: "
                        + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in row.items()),
                        flush=True,
                    )
        finally:
            server.kill()
    columns = ("python", "torch+transformers", *ROLE_ARGS)
    lines = [
        "## Role start-up",
        "",
        f"`python benchmarks/bench_role_startup.py --rounds {args.rounds}"
        + (" --before <checkout of the commit before>" if args.before else "")
        + f" --write-docs` — {date.today()}, {os.cpu_count()} CPUs, load average "
        f"{min(load):.1f}-{max(load):.1f} during the run. Seconds from a role's process start "
        "until it can work (the quickstart's roles, without the warm start), median of "
        f"{args.rounds} rounds; a bare interpreter and `import torch, transformers` measured in "
        "the same rounds as baselines.",
        "",
        "| checkout | " + " | ".join(columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for name, row in measured.items():
        cells = " | ".join(f"{statistics.median(row[c]):.2f}" for c in columns)
        lines.append(f"| {name} | {cells} |")
    print("\n".join(lines))
    if args.write_docs:
        replace_section("role-startup", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
