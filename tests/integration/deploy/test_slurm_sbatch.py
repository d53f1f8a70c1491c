"""``dockyard launch slurm`` through a real one-host Slurm cluster (tests/slurm_cluster.py:
munged, slurmctld and slurmd, CPUs as the resource): the quickstart's script, shortened by
overrides, is submitted with ``sbatch``; the job must complete with the trainer's status, every
dispatched group must be trained exactly once (or named open at the end), every role must have
drained on its SIGTERM (each step's srun exits 0: a step that srun had to kill exits 137), the
broker must stop last, and no job step or role process may be left."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _launch(tmp_path: Path, run_dir: Path, broker_port: int) -> Path:
    script = tmp_path / "fleet.sbatch"
    subprocess.run(
        [sys.executable, "-m", "dockyard", "launch", "slurm", "--config", str(QUICKSTART),
         "--nodes", "1", "--workers-per-node", "1", "--scorers", "1",
         "--run-dir", str(run_dir), "--broker-port", str(broker_port),
         "--rendezvous-port", str(free_port()), "-o", str(script),
         *SMALL_RUN, f"grpo.max_num_steps={STEPS}"],
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


def test_the_quickstart_runs_through_sbatch(cluster: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    broker_port = free_port()
    script = _launch(tmp_path, run_dir, broker_port)
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
    job_id = submitted.stdout.strip().split(";")[0]
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
    stopped = [line.split() for line in batch_out.splitlines() if line.startswith("step ")]
    # "step NAME (srun PID) exited with STATUS": the roles (in any order), then the broker
    names = [words[1] for words in stopped]
    assert sorted(names[:-1]) == ["rollout", "scorer"] and names[-1:] == ["broker"], batch_out
    assert all(words[-1] == "0" for words in stopped), batch_out
    for log in ("broker.log", "trainer.log", f"rollout-{cluster.node}-0.log", "scorer-0.log"):
        assert (logs / log).stat().st_size > 0, log
    assert "nats_server.stopped" in (logs / "broker.log").read_text()

    # Nothing is left: no step in Slurm, no role process on the host.
    assert cluster.steps() == []
    assert "No job steps" in cluster.run("scontrol", "show", "step").stdout
    assert _role_processes(str(run_dir)) == []
    assert _role_processes(f"nats://{cluster.node}:{broker_port}") == []
