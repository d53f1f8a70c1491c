"""``dockyard launch slurm``: the sbatch script's structure (``bash -n``, the headers, the broker,
torchrun's rendezvous on the first node, one rollout worker per GPU, the scorer pool, per-role
logs), and its shutdown run with stand-ins for ``srun``/``squeue``/``scancel``/``scontrol`` and
the roles: when the trainer exits, every other step gets SIGTERM through ``scancel`` and the
script exits with the trainer's status; a step that does not drain in time is killed. The real
slurmctld/slurmd run is tests/integration/deploy/test_slurm_sbatch.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from dockyard.cli import main

ROOT = Path(__file__).resolve().parents[3]
CONFIG = str(ROOT / "configs/quickstart.yaml")


def _script(tmp_path: Path, *options: str) -> str:
    out = tmp_path / "fleet.sbatch"
    argv = ["launch", "slurm", "--config", CONFIG, "--run-dir", str(tmp_path / "run")]
    assert main([*argv, *options, "-o", str(out)]) == 0
    text = out.read_text()
    subprocess.run(["bash", "-n", str(out)], check=True)
    return text


def test_a_gpu_fleet(tmp_path: Path) -> None:
    text = _script(
        tmp_path,
        "--nodes", "4", "--trainer-nodes", "2", "--gpus-per-node", "8", "--scorers", "6",
        "--partition", "gpu", "--time", "12:00:00", "grpo.max_num_steps=500",
    )  # fmt: skip
    for header in ("--nodes=4", "--gpus-per-node=8", "--partition=gpu", "--time=12:00:00"):
        assert f"#SBATCH {header}" in text
    # before the time limit Slurm SIGTERMs the script alone (B:), in time for two drains
    assert "#SBATCH --signal=B:TERM@300" in text
    assert (tmp_path / "run" / "logs").is_dir()  # Slurm opens --output there before the script
    assert "TRAINER_NODES=2" in text and "WORKERS_PER_NODE=8" in text and "SCORERS=6" in text
    # the broker on the first node, the roles pointed at it
    assert re.search(
        r'-w "\$HEAD" -J broker \\\n\s+\$DOCKYARD broker up --store "\$RUN_DIR/nats"', text
    )
    assert 'NATS_URL="nats://$HEAD:4222"' in text
    # torchrun across the trainer nodes, rendezvous on the first
    assert '--rdzv_endpoint="$HEAD:29500"' in text and '--nnodes="$TRAINER_NODES"' in text
    assert 'cluster.num_nodes="$TRAINER_NODES"' in text
    # on SIGTERM torchrun gives its ranks the whole drain (its own default is 30 s)
    assert '--shutdown-timeout="$DRAIN_TIMEOUT_S"' in text
    # one worker per GPU, each seeing its own device
    assert "CUDA_VISIBLE_DEVICES=$(seq -s, $((i * GPUS_PER_WORKER))" in text
    # overrides reach every role, quoted
    assert text.count('"${OVERRIDES[@]}"') == 4 and "OVERRIDES=(grpo.max_num_steps=500)" in text
    for log in ("broker.log", "trainer.log", "rollout-$host-$i.log", "scorer-$j.log"):
        assert f'"$RUN_DIR/logs/{log}"' in text
    assert 'wait "$TRAINER_PID"' in text and "trap 'stop_all 143' TERM INT" in text
    # each role its own named step: the shutdown signals them by name, the broker last
    for role in ("broker", "trainer", "rollout", "scorer"):
        assert f"-J {role}" in text
    assert "stop_steps trainer rollout scorer\n    stop_steps broker\n" in text


def test_ports_for_a_shared_node(tmp_path: Path) -> None:
    text = _script(tmp_path, "--nodes", "1", "--broker-port", "4300", "--rendezvous-port", "29600")
    assert 'NATS_URL="nats://$HEAD:4300"' in text and "--port 4300" in text
    assert '--rdzv_endpoint="$HEAD:29600"' in text


def test_tensor_parallel_workers_and_an_external_broker(tmp_path: Path) -> None:
    text = _script(
        tmp_path, "--nodes", "3", "--gpus-per-node", "8", "--gpus-per-worker", "4",
        "--broker-url", "nats://broker.example:4222",
    )  # fmt: skip
    assert "WORKERS_PER_NODE=2" in text and "GPUS_PER_WORKER=4" in text
    assert "NATS_URL=nats://broker.example:4222" in text and "broker up" not in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--nodes", "1", "--gpus-per-node", "8"], "nodes of their own"),
        (["--nodes", "2", "--trainer-nodes", "3"], "more than --nodes"),
        (["--nodes", "2", "--gpus-per-node", "8", "--gpus-per-worker", "3"], "does not divide"),
        (["--nodes", "1", "--broker-port", "70000"], "not a TCP port"),
    ],
)
def test_impossible_layouts_are_refused(
    tmp_path: Path, options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["launch", "slurm", "--config", CONFIG, *options, "-o", str(tmp_path / "x")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _stand_ins(bin_dir: Path, trainer_status: int) -> None:
    """Slurm as the script sees it. srun runs its command as the step's task (dropping its own
    options), records ``JOB.PID NAME`` for squeue, and turns a SIGTERM into SIGKILL for its task
    (as srun does); squeue lists the live steps; scancel sends its signal to a step's task;
    scontrol names two nodes. The roles record their argv and, but for the trainer, wait for
    SIGTERM (a rollout worker with ``ROLE_DEAF`` set ignores it)."""
    bin_dir.mkdir()
    scripts = {
        "scontrol": "printf 'node1\\nnode2\\n'",
        "srun": textwrap.dedent("""\
            name=
            while [[ $# -gt 0 && $1 == -* ]]; do
                case $1 in -w) shift 2 ;; -J) name=$2; shift 2 ;; *) shift ;; esac
            done
            "$@" &
            task=$!
            echo "42.$task $name" >>"$STEPS_FILE"
            trap 'kill -KILL $task' TERM
            while kill -0 $task 2>/dev/null; do wait $task; done
            wait $task  # the task's own status (bash keeps it once reaped)
            """),
        "squeue": textwrap.dedent("""\
            while read -r id name; do
                kill -0 "${id#42.}" 2>/dev/null && echo "$id $name"
            done <"$STEPS_FILE"
            """),
        "scancel": textwrap.dedent("""\
            echo "scancel $*" >>"$ROLE_LOG"
            for arg in "$@"; do
                case $arg in
                    --signal=*) sig=${arg#--signal=} ;;
                    *) kill -"$sig" "${arg#42.}" ;;
                esac
            done
            """),
        "role": textwrap.dedent(f"""\
            echo "$*" >>"$ROLE_LOG"
            case " $* " in
                *" trainer "*) sleep 1; exit {trainer_status} ;;
                *" rollout "*) [[ -n ${{ROLE_DEAF:-}} ]] && trap '' TERM ;;
            esac
            [[ -n ${{ROLE_DEAF:-}} && " $* " == *" rollout "* ]] || \\
                trap 'echo "TERM $*" >>"$ROLE_LOG"; exit 0' TERM
            while true; do sleep 0.1; done
            """),
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)


def _run_fleet(
    tmp_path: Path, trainer_status: int, drain_timeout_s: int | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[bytes], list[str]]:
    """The script of a two-node CPU fleet (an external broker: nothing listens here) run with
    the stand-ins: its result and the roles' log."""
    text = _script(
        tmp_path, "--nodes", "2", "--workers-per-node", "2", "--scorers", "2",
        "--broker-url", "nats://127.0.0.1:1",
    )  # fmt: skip
    if drain_timeout_s is not None:
        assert "DRAIN_TIMEOUT_S=120" in text
        text = text.replace("DRAIN_TIMEOUT_S=120", f"DRAIN_TIMEOUT_S={drain_timeout_s}")
        (tmp_path / "fleet.sbatch").write_text(text)
    bin_dir = tmp_path / "bin"
    _stand_ins(bin_dir, trainer_status=trainer_status)
    log = tmp_path / "roles.log"
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_ID": "42",
        "DOCKYARD": str(bin_dir / "role"),
        "TORCHRUN": str(bin_dir / "role"),
        "ROLE_LOG": str(log),
        "STEPS_FILE": str(tmp_path / "steps"),
        **env,
    }
    result = subprocess.run(
        ["bash", str(tmp_path / "fleet.sbatch")], env=environment, timeout=60, capture_output=True
    )
    return result, log.read_text().splitlines()


def _step_statuses(stderr: bytes) -> dict[str, list[str]]:
    """``step NAME (srun PID) exited with STATUS`` lines: each name's statuses."""
    statuses: dict[str, list[str]] = {}
    for line in stderr.decode().splitlines():
        if line.startswith("step "):
            words = line.split()
            statuses.setdefault(words[1], []).append(words[-1])
    return statuses


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_fleet_stops_when_the_trainer_ends(tmp_path: Path) -> None:
    result, lines = _run_fleet(tmp_path, trainer_status=3)
    assert result.returncode == 3, result.stderr  # the trainer's status
    started = [line for line in lines if not line.startswith(("TERM", "scancel"))]
    stopped = [line for line in lines if line.startswith("TERM")]
    # one trainer on node1 (torchrun ... -m dockyard ... trainer), a worker per node and slot
    assert sum(" trainer " in f" {line} " for line in started) == 1
    workers = sorted(re.findall(r"--worker-id (\S+)", " ".join(started)))
    assert workers == ["node2-0", "node2-1"]
    assert sum(" score " in f" {line} " for line in started) == 2
    # every role but the trainer was told to stop, through Slurm (one scancel for the four
    # steps), and drained: each srun exited 0
    assert len(stopped) == 4, lines
    assert [line.count("42.") for line in lines if line.startswith("scancel")] == [4]
    assert _step_statuses(result.stderr) == {"rollout": ["0", "0"], "scorer": ["0", "0"]}
    assert (tmp_path / "run" / "logs" / "trainer.log").exists()
    assert "trainer exited with 3" in result.stderr.decode()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_step_that_does_not_drain_is_killed(tmp_path: Path) -> None:
    # rollout workers that ignore SIGTERM, and a drain of 1 s: their srun kills them (137)
    result, _ = _run_fleet(tmp_path, trainer_status=0, drain_timeout_s=1, ROLE_DEAF="1")
    assert result.returncode == 0, result.stderr
    assert "rollout did not drain in 1 s: killing its step" in result.stderr.decode()
    assert _step_statuses(result.stderr) == {"rollout": ["137", "137"], "scorer": ["0", "0"]}
