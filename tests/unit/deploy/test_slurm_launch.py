"""``dockyard launch slurm``: the sbatch script's structure (``bash -n``, the headers, the broker,
torchrun's rendezvous on the first node, one rollout worker per GPU, the scorer pool, per-role
logs), and its shutdown run for real with stand-ins for ``srun``/``scontrol`` and the roles: when
the trainer exits, every other step gets SIGTERM and the script exits with the trainer's status.
(The real slurmctld/slurmd end-to-end run is not here: docs/deployment.md says how it would be.)"""

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
    assert "TRAINER_NODES=2" in text and "WORKERS_PER_NODE=8" in text and "SCORERS=6" in text
    # the broker on the first node, the roles pointed at it
    assert re.search(r'-w "\$HEAD" \\\n\s+\$DOCKYARD broker up --store "\$RUN_DIR/nats"', text)
    assert 'NATS_URL="nats://$HEAD:4222"' in text
    # torchrun across the trainer nodes, rendezvous on the first
    assert '--rdzv_endpoint="$HEAD:29500"' in text and '--nnodes="$TRAINER_NODES"' in text
    assert 'cluster.num_nodes="$TRAINER_NODES"' in text
    # one worker per GPU, each seeing its own device
    assert "CUDA_VISIBLE_DEVICES=$(seq -s, $((i * GPUS_PER_WORKER))" in text
    # overrides reach every role, quoted
    assert text.count('"${OVERRIDES[@]}"') == 4 and "OVERRIDES=(grpo.max_num_steps=500)" in text
    for log in ("broker.log", "trainer.log", "rollout-$host-$i.log", "scorer-$j.log"):
        assert f'"$RUN_DIR/logs/{log}"' in text
    assert 'wait "$TRAINER_PID"' in text and "trap 'stop_all 143' TERM INT" in text


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
    ],
)
def test_impossible_layouts_are_refused(
    tmp_path: Path, options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["launch", "slurm", "--config", CONFIG, *options, "-o", str(tmp_path / "x")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _stand_ins(bin_dir: Path, trainer_status: int) -> None:
    """srun runs its command here (dropping its own options); scontrol names two nodes; the
    roles record their argv and, but for the trainer, wait for SIGTERM."""
    bin_dir.mkdir()
    scripts = {
        "scontrol": "printf 'node1\\nnode2\\n'",
        "srun": textwrap.dedent("""\
            while [[ $# -gt 0 && $1 == -* ]]; do
                case $1 in -w) shift 2 ;; *) shift ;; esac
            done
            exec "$@"
            """),
        "role": textwrap.dedent(f"""\
            echo "$*" >>"$ROLE_LOG"
            case " $* " in
                *" trainer "*) sleep 1; exit {trainer_status} ;;
            esac
            trap 'echo "TERM $*" >>"$ROLE_LOG"; exit 0' TERM
            while true; do sleep 0.1; done
            """),
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_fleet_stops_when_the_trainer_ends(tmp_path: Path) -> None:
    # external broker: nothing listens in this test
    text = _script(
        tmp_path, "--nodes", "2", "--workers-per-node", "2", "--scorers", "2",
        "--broker-url", "nats://127.0.0.1:1",
    )  # fmt: skip
    bin_dir = tmp_path / "bin"
    _stand_ins(bin_dir, trainer_status=3)
    log = tmp_path / "roles.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_ID": "42",
        "DOCKYARD": str(bin_dir / "role"),
        "TORCHRUN": str(bin_dir / "role"),
        "ROLE_LOG": str(log),
    }
    result = subprocess.run(
        ["bash", str(tmp_path / "fleet.sbatch")], env=env, timeout=60, capture_output=True
    )
    assert result.returncode == 3, result.stderr  # the trainer's status
    lines = log.read_text().splitlines()
    started = [line for line in lines if not line.startswith("TERM")]
    stopped = [line for line in lines if line.startswith("TERM")]
    # one trainer on node1 (torchrun ... -m dockyard ... trainer), a worker per node and slot
    assert sum(" trainer " in f" {line} " for line in started) == 1
    workers = sorted(re.findall(r"--worker-id (\S+)", " ".join(started)))
    assert workers == ["node2-0", "node2-1"]
    assert sum(" score " in f" {line} " for line in started) == 2
    # every role but the trainer was told to stop
    assert len(stopped) == 4, lines
    assert (tmp_path / "run" / "logs" / "trainer.log").exists()
    assert "trainer exited with 3" in result.stderr.decode()
    assert text  # the same script that bash -n accepted
