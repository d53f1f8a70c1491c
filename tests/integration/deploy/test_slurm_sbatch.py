"""``dockyard launch slurm`` through a real one-host Slurm cluster (tests/slurm_cluster.py:
munged, slurmctld and slurmd, CPUs as the resource): the quickstart's script, shortened by
overrides, is submitted with ``sbatch``.

- Run to its end: the job completes with the trainer's status, every dispatched group is trained
  exactly once (or named open at the end), every role drains on its SIGTERM (each step's srun
  exits 0: a step that srun had to kill exits 137), the broker stops last, and no job step or
  role process is left.
- Stopped and resumed: ``scancel --batch --signal=TERM`` mid-run stops the fleet the same way
  (the trainer too, with a checkpoint), and a second job on the same run directory resumes at
  the next step and trains no group twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dockyard.consumers.trainer.ledger import read_trail
from tests.integration.e2e.conftest import QUICKSTART, ROOT, SMALL_RUN
from tests.integration.e2e.ledger_checks import (
    assert_every_group_accounted,
    assert_exactly_once,
    metric_steps,
)
from tests.slurm_cluster import SlurmCluster, free_port, slurm_cluster

pytestmark = pytest.mark.slow

STEPS = 3
PROMPTS_PER_STEP = 4  # SMALL_RUN's grpo.num_prompts_per_step
JOB_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def _launch(tmp_path: Path, run_dir: Path, broker_port: int, steps: int = STEPS) -> Path:
    script = tmp_path / f"fleet-{steps}.sbatch"
    subprocess.run(
        [sys.executable, "-m", "dockyard", "launch", "slurm", "--config", str(QUICKSTART),
         "--nodes", "1", "--workers-per-node", "1", "--scorers", "1",
         "--run-dir", str(run_dir), "--broker-port", str(broker_port),
         "--rendezvous-port", str(free_port()), "-o", str(script),
         *SMALL_RUN, f"grpo.max_num_steps={steps}"],
        cwd=ROOT, check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return script


def _role_processes(marker: str) -> list[str]:
    """Command lines of live processes that name ``marker`` (this run's roles)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if marker in argv:
            found.append(argv)
    return found


def _submit(cluster: SlurmCluster, script: Path, tmp_path: Path) -> str:
    env = {
        **cluster.env,
        # The roles run this checkout's dockyard with this interpreter (sbatch passes the
        # environment on to the job; the script's DOCKYARD/TORCHRUN replace its commands).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "DOCKYARD": f"{sys.executable} -m dockyard",
        "TORCHRUN": f"{sys.executable} -m torch.distributed.run",
    }
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={tmp_path}", str(script)],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return submitted.stdout.strip().split(";")[0]


def _stopped_steps(batch_out: str) -> list[tuple[str, str]]:
    """The script's ``step NAME (srun PID) exited with STATUS`` lines, in order."""
    lines = [line.split() for line in batch_out.splitlines() if line.startswith("step ")]
    return [(words[1], words[-1]) for words in lines]


def _assert_nothing_left(cluster: SlurmCluster, run_dir: Path, broker_port: int) -> None:
    """No step in Slurm, no role process on the host."""
    assert cluster.steps() == []
    assert "No job steps" in cluster.run("scontrol", "show", "step").stdout
    assert _role_processes(str(run_dir)) == []
    assert _role_processes(f"nats://{cluster.node}:{broker_port}") == []


def _trained_steps(run_dir: Path) -> int:
    trail = run_dir / "ledger.jsonl"
    events = read_trail(trail) if trail.exists() else []
    return max((int(str(e["step"])) for e in events if e["event"] == "trained"), default=0)


def test_the_quickstart_runs_through_sbatch(cluster: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    broker_port = free_port()
    job_id = _submit(cluster, _launch(tmp_path, run_dir, broker_port), tmp_path)
    job = cluster.wait_for_job(job_id, JOB_TIMEOUT_S)
    logs = run_dir / "logs"
    batch_out = (logs / f"sbatch-{job_id}.out").read_text()
    context = f"{job}\n{batch_out}\n{(logs / 'trainer.log').read_text()[-3000:]}"
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", context

    # The trainer ran its steps and the ledger accounts for every group once.
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * PROMPTS_PER_STEP
    assert_every_group_accounted(run_dir)

    # Every role had its own step and log, drained on SIGTERM, and the broker stopped last.
    assert "trainer exited with 0; stopping the fleet" in batch_out
    stopped = _stopped_steps(batch_out)
    assert sorted(stopped[:-1]) == [("rollout", "0"), ("scorer", "0")], batch_out
    assert stopped[-1:] == [("broker", "0")], batch_out
    for log in ("broker.log", "trainer.log", f"rollout-{cluster.node}-0.log", "scorer-0.log"):
        assert (logs / log).stat().st_size > 0, log
    assert "nats_server.stopped" in (logs / "broker.log").read_text()
    _assert_nothing_left(cluster, run_dir, broker_port)


def test_a_cancelled_job_drains_and_the_next_one_resumes(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    broker_port = free_port()
    job_id = _submit(cluster, _launch(tmp_path, run_dir, broker_port, steps=1000), tmp_path)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while _trained_steps(run_dir) < 2:  # polling the run's ledger for its second step
        state = cluster.job(job_id).get("JobState")
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), state
        assert time.monotonic() < deadline, "no second step in time"
        time.sleep(0.5)
    cluster.run("scancel", "--batch", "--signal=TERM", job_id)
    job = cluster.wait_for_job(job_id, JOB_TIMEOUT_S)
    batch_out = (run_dir / "logs" / f"sbatch-{job_id}.out").read_text()
    # the script's exit status says it was stopped (143); every role drained, the broker last
    assert job["ExitCode"] == "143:0", (job, batch_out)
    stopped = dict(_stopped_steps(batch_out)[:-1])
    assert _stopped_steps(batch_out)[-1:] == [("broker", "0")], batch_out
    assert stopped.pop("rollout") == stopped.pop("scorer") == "0", batch_out
    # torchrun exits 1 on a SIGTERM (its SignalException) once its rank has drained; 137
    # would be a kill
    assert stopped == {"trainer": "1"}, batch_out
    _assert_nothing_left(cluster, run_dir, broker_port)
    # the trainer drained: it finished its step, checkpointed it and named what was left open
    before = _trained_steps(run_dir)
    assert (run_dir / "checkpoints" / f"step_{before}").is_dir()
    reasons = {e.get("reason") for e in read_trail(run_dir / "ledger.jsonl")} - {None}
    assert reasons == {"the trainer was stopped"}
    trained_before = set(assert_exactly_once(run_dir))
    assert len(trained_before) == before * PROMPTS_PER_STEP

    # The next job on the same run directory resumes at the next step.
    broker_port = free_port()
    script = _launch(tmp_path, run_dir, broker_port, steps=before + 2)
    job_id = _submit(cluster, script, tmp_path)
    job = cluster.wait_for_job(job_id, JOB_TIMEOUT_S)
    batch_out = (run_dir / "logs" / f"sbatch-{job_id}.out").read_text()
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, batch_out)
    assert metric_steps(run_dir)[-2:] == [before + 1, before + 2]
    trained_after = set(assert_exactly_once(run_dir))
    assert trained_before < trained_after
    assert len(trained_after) == (before + 2) * PROMPTS_PER_STEP
    assert_every_group_accounted(run_dir)
    _assert_nothing_left(cluster, run_dir, broker_port)
