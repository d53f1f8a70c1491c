"""An sbatch script for a whole fleet in one Slurm allocation.

The first node hosts the broker (unless an external ``nats://`` URL is given), the scorer pool and
the torchrun rendezvous; the first ``trainer_nodes`` nodes run the trainer under torchrun (one
process per node, ``gpus_per_node`` ranks each); the other nodes run one rollout worker per GPU
(or per tensor-parallel group of ``gpus_per_worker`` GPUs). Every role writes its own log under
``<run_dir>/logs/``. When the trainer ends, the script sends SIGTERM to every other step (each
dockyard role drains on SIGTERM), waits for them, and exits with the trainer's status; a
cancelled or timed-out job (SIGTERM to the batch script) is passed on the same way.

The script is plain bash over ``srun``/``scontrol`` so that it can be read, edited and checked
(``bash -n``) before it is submitted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

BROKER_PORT = 4222
RENDEZVOUS_PORT = 29500


class SlurmPlanError(ValueError):
    """A fleet shape that cannot be laid out on the allocation."""


@dataclass(frozen=True)
class SlurmFleet:
    config_path: str
    overrides: tuple[str, ...]
    run_dir: str
    job_name: str
    nodes: int
    trainer_nodes: int = 1
    gpus_per_node: int = 0
    gpus_per_worker: int = 1
    # Without GPUs (a CPU cluster, the test cluster): rollout workers per rollout node.
    workers_per_node: int = 1
    scorers: int = 1
    broker_url: str | None = None
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    dockyard: str = "dockyard"
    torchrun: str = "torchrun"
    drain_timeout_s: int = 120

    def check(self) -> None:
        if self.nodes < 1 or self.trainer_nodes < 1:
            raise SlurmPlanError("--nodes and --trainer-nodes must be at least 1")
        if self.trainer_nodes > self.nodes:
            raise SlurmPlanError(
                f"--trainer-nodes {self.trainer_nodes} is more than --nodes {self.nodes}"
            )
        if self.gpus_per_node and self.gpus_per_node % self.gpus_per_worker:
            raise SlurmPlanError(
                f"--gpus-per-worker {self.gpus_per_worker} does not divide --gpus-per-node "
                f"{self.gpus_per_node}"
            )
        if self.gpus_per_node and self.nodes == self.trainer_nodes:
            raise SlurmPlanError(
                "with GPUs the rollout workers need nodes of their own: --nodes must be more "
                "than --trainer-nodes"
            )
        if self.scorers < 1:
            raise SlurmPlanError("--scorers must be at least 1")

    @property
    def rollout_nodes(self) -> int:
        # Without GPUs the workers may share the trainer's nodes (a one-host CPU cluster).
        return self.nodes - self.trainer_nodes or self.nodes

    @property
    def workers_on_each_node(self) -> int:
        if self.gpus_per_node:
            return self.gpus_per_node // self.gpus_per_worker
        return self.workers_per_node

    @property
    def num_rollout_workers(self) -> int:
        return self.rollout_nodes * self.workers_on_each_node


def _q(value: str) -> str:
    return shlex.quote(value)


def render_sbatch(fleet: SlurmFleet) -> str:
    fleet.check()
    headers = [
        f"#SBATCH --job-name={fleet.job_name}",
        f"#SBATCH --nodes={fleet.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={fleet.run_dir}/logs/sbatch-%j.out",
    ]
    if fleet.gpus_per_node:
        headers += [f"#SBATCH --gpus-per-node={fleet.gpus_per_node}", "#SBATCH --exclusive"]
    if fleet.partition:
        headers.append(f"#SBATCH --partition={fleet.partition}")
    if fleet.account:
        headers.append(f"#SBATCH --account={fleet.account}")
    if fleet.time_limit:
        headers.append(f"#SBATCH --time={fleet.time_limit}")
    overrides = " ".join(_q(o) for o in fleet.overrides)  # a bash array: each override one word
    broker = (
        f"NATS_URL={_q(fleet.broker_url)}\n"
        if fleet.broker_url
        else f"""NATS_URL="nats://$HEAD:{BROKER_PORT}"
# The broker: JetStream's store in the run directory (a resumed job finds its streams).
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" \\
    $DOCKYARD broker up --store "$RUN_DIR/nats" --host 0.0.0.0 --port {BROKER_PORT} \\
    --config "$CONFIG" "${{OVERRIDES[@]}}" >"$RUN_DIR/logs/broker.log" 2>&1 &
STEPS+=($!)
wait_for_port "$HEAD" {BROKER_PORT} 120 || {{ echo "broker did not start" >&2; stop_all 1; }}
"""
    )
    gpu_env = (
        "CUDA_VISIBLE_DEVICES=$(seq -s, $((i * GPUS_PER_WORKER)) "
        "$(((i + 1) * GPUS_PER_WORKER - 1)))"
        if fleet.gpus_per_node
        else ""
    )
    return f"""#!/bin/bash
# A dockyard fleet in one allocation, written by `dockyard launch slurm` (dockyard/launch/slurm.py).
# Submit with: sbatch THIS_FILE
{chr(10).join(headers)}
set -uo pipefail

RUN_DIR={_q(fleet.run_dir)}
CONFIG={_q(fleet.config_path)}
OVERRIDES=({overrides})
# Words, unquoted where used: "python -m dockyard" works as well as a path.
DOCKYARD=${{DOCKYARD:-{_q(fleet.dockyard)}}}
TORCHRUN=${{TORCHRUN:-{_q(fleet.torchrun)}}}
TRAINER_NODES={fleet.trainer_nodes}
GPUS_PER_NODE={fleet.gpus_per_node}
GPUS_PER_WORKER={fleet.gpus_per_worker}
WORKERS_PER_NODE={fleet.workers_on_each_node}
SCORERS={fleet.scorers}
DRAIN_TIMEOUT_S={fleet.drain_timeout_s}
RANKS_PER_NODE=$(( GPUS_PER_NODE > 0 ? GPUS_PER_NODE : 1 ))  # torchrun processes on each node

umask 077  # the logs and the store may hold credentials
mkdir -p "$RUN_DIR/logs"
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD=${{NODES[0]}}
TRAINER_HOSTS=("${{NODES[@]:0:TRAINER_NODES}}")
if (( ${{#NODES[@]}} > TRAINER_NODES )); then
    ROLLOUT_HOSTS=("${{NODES[@]:TRAINER_NODES}}")
else
    ROLLOUT_HOSTS=("${{NODES[@]}}")  # no GPUs: the workers share the trainer's nodes
fi
STEPS=()

wait_for_port() {{  # host port seconds
    local deadline=$((SECONDS + $3))
    until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
        (( SECONDS < deadline )) || return 1
        sleep 1
    done
}}

stop_all() {{  # exit status: SIGTERM every step, wait for them to drain, then exit
    trap - TERM INT
    local pid
    for pid in "${{STEPS[@]}}"; do kill -TERM "$pid" 2>/dev/null; done
    local deadline=$((SECONDS + DRAIN_TIMEOUT_S))
    for pid in "${{STEPS[@]}}"; do
        while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 1; done
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    exit "$1"
}}
# scancel or the time limit: pass SIGTERM on to every role
trap 'stop_all 143' TERM INT

{broker}
# The trainer (with the dispatcher): one torchrun per trainer node, rendezvous on the first node.
srun --overlap --nodes="$TRAINER_NODES" --ntasks-per-node=1 \\
    -w "$(IFS=,; echo "${{TRAINER_HOSTS[*]}}")" \\
    $TORCHRUN --nnodes="$TRAINER_NODES" --nproc_per_node="$RANKS_PER_NODE" \\
    --rdzv_backend=c10d --rdzv_endpoint="$HEAD:{RENDEZVOUS_PORT}" --rdzv_id="$SLURM_JOB_ID" \\
    -m dockyard --log-format json trainer --config "$CONFIG" --run-dir "$RUN_DIR" \\
    "${{OVERRIDES[@]}}" \\
    data_plane.url="$NATS_URL" cluster.num_nodes="$TRAINER_NODES" \\
    cluster.gpus_per_node="$GPUS_PER_NODE" >"$RUN_DIR/logs/trainer.log" 2>&1 &
TRAINER_PID=$!

# Rollout workers: {fleet.workers_on_each_node} on each rollout node (one per GPU or TP group).
for host in "${{ROLLOUT_HOSTS[@]}}"; do
    for ((i = 0; i < WORKERS_PER_NODE; i++)); do
        {gpu_env} srun --overlap --nodes=1 --ntasks=1 -w "$host" \\
            $DOCKYARD --log-format json rollout --config "$CONFIG" --worker-id "$host-$i" \\
            "${{OVERRIDES[@]}}" data_plane.url="$NATS_URL" \\
            >"$RUN_DIR/logs/rollout-$host-$i.log" 2>&1 &
        STEPS+=($!)
    done
done

# The scorer pool, on the first node (CPU work; one durable consumer shared by all).
for ((j = 0; j < SCORERS; j++)); do
    srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" \\
        $DOCKYARD --log-format json score --config "$CONFIG" "${{OVERRIDES[@]}}" \\
        data_plane.url="$NATS_URL" >"$RUN_DIR/logs/scorer-$j.log" 2>&1 &
    STEPS+=($!)
done

# The run ends when the trainer does: drain every other role, then report the trainer's status.
wait "$TRAINER_PID"
TRAINER_STATUS=$?
echo "trainer exited with $TRAINER_STATUS; stopping the fleet" >&2
stop_all "$TRAINER_STATUS"
"""
