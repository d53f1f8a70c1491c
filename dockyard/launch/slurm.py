"""An sbatch script for a whole fleet in one Slurm allocation.

The first node hosts the broker (unless an external ``nats://`` URL is given), the scorer pool and
the torchrun rendezvous; the first ``trainer_nodes`` nodes run the trainer under torchrun (one
process per node, ``gpus_per_node`` ranks each); the other nodes run one rollout worker per GPU
(or per tensor-parallel group of ``gpus_per_worker`` GPUs). Every role writes its own log under
``<run_dir>/logs/``.

Shutdown. Each role is its own job step, named after its role (``srun -J``). When the trainer
ends, the script asks Slurm to SIGTERM the other roles' steps (``scancel --signal=TERM`` on
their step ids: each dockyard role drains on SIGTERM), waits for them, then stops the broker the
same way, and exits with the trainer's status. It never signals an ``srun`` itself while its
step drains: srun turns a SIGTERM into SIGKILL for its step, so that is kept for a step that
does not end within ``drain_timeout_s``. SIGTERM to the batch script alone (``scancel --batch
--signal=TERM``, or ``--signal=B:TERM@…`` before the time limit) runs the same shutdown.

The script is plain bash over ``srun``/``squeue``/``scancel``/``scontrol`` so that it can be
read, edited and checked (``bash -n``) before it is submitted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

BROKER_PORT = 4222
RENDEZVOUS_PORT = 29500
# Slurm SIGTERMs the batch script this long before the time limit (sbatch --signal=B:TERM@…):
# the roles' drain, then the broker's, with time to spare.
SIGNAL_MARGIN_S = 60


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
    # On the first node; other ports where a node is shared (a one-host test cluster).
    broker_port: int = BROKER_PORT
    rendezvous_port: int = RENDEZVOUS_PORT

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
        for flag, port in (
            ("--broker-port", self.broker_port),
            ("--rendezvous-port", self.rendezvous_port),
        ):
            if not 0 < port < 65536:
                raise SlurmPlanError(f"{flag} {port} is not a TCP port")

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


def _headers(fleet: SlurmFleet) -> list[str]:
    headers = [
        f"#SBATCH --job-name={fleet.job_name}",
        f"#SBATCH --nodes={fleet.nodes}",
        "#SBATCH --ntasks-per-node=1",
        # Slurm opens this before the script runs: `dockyard launch slurm` creates logs/.
        f"#SBATCH --output={fleet.run_dir}/logs/sbatch-%j.out",
        # Before the time limit, SIGTERM to this script alone: it drains the fleet.
        f"#SBATCH --signal=B:TERM@{2 * fleet.drain_timeout_s + SIGNAL_MARGIN_S}",
    ]
    if fleet.gpus_per_node:
        headers += [f"#SBATCH --gpus-per-node={fleet.gpus_per_node}", "#SBATCH --exclusive"]
    if fleet.partition:
        headers.append(f"#SBATCH --partition={fleet.partition}")
    if fleet.account:
        headers.append(f"#SBATCH --account={fleet.account}")
    if fleet.time_limit:
        headers.append(f"#SBATCH --time={fleet.time_limit}")
    return headers


def _broker(fleet: SlurmFleet) -> str:
    if fleet.broker_url:
        return f"NATS_URL={_q(fleet.broker_url)}\n"
    port = fleet.broker_port
    return f"""NATS_URL="nats://$HEAD:{port}"
# The broker: JetStream's store in the run directory (a resumed job finds its streams).
srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" -J broker \\
    $DOCKYARD broker up --store "$RUN_DIR/nats" --host 0.0.0.0 --port {port} \\
    --config "$CONFIG" "${{OVERRIDES[@]}}" >"$RUN_DIR/logs/broker.log" 2>&1 &
STEP_NAME[$!]=broker
wait_for_port "$HEAD" {port} 120 || {{ echo "broker did not start" >&2; stop_all 1; }}
"""


# The shell functions every script starts with (no fleet-specific values).
_FUNCTIONS = r"""
wait_for_port() {  # host port seconds
    local deadline=$((SECONDS + $3))
    until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
        (( SECONDS < deadline )) || return 1
        sleep 1
    done
}

step_ids() {  # names...: the ids of this job's running steps that have one of these names
    local id name want
    squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' 2>/dev/null | while read -r id name; do
        for want in "$@"; do [[ $name == "$want" ]] && echo "$id"; done
    done
}

stop_steps() {  # names...: SIGTERM those steps through Slurm, wait for them to drain
    local pid status names=" $* " pids=() ids=()
    for pid in "${!STEP_NAME[@]}"; do
        [[ $names == *" ${STEP_NAME[$pid]} "* ]] && pids+=("$pid")
    done
    (( ${#pids[@]} )) || return 0
    mapfile -t ids < <(step_ids "$@")
    # srun would turn a SIGTERM into SIGKILL for its step: ask Slurm to signal the steps.
    (( ${#ids[@]} )) && scancel --signal=TERM "${ids[@]}"
    local deadline=$((SECONDS + DRAIN_TIMEOUT_S))
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "${STEP_NAME[$pid]} did not drain in $DRAIN_TIMEOUT_S s: killing its step" >&2
            kill -TERM "$pid"  # srun SIGKILLs its step
        fi
        wait "$pid"
        status=$?
        echo "step ${STEP_NAME[$pid]} (srun $pid) exited with $status" >&2
        unset "STEP_NAME[$pid]"
    done
}

stop_all() {  # exit status: drain the roles while the broker still runs, then the broker, exit
    trap - TERM INT
    stop_steps trainer rollout scorer
    stop_steps broker
    exit "$1"
}
# SIGTERM to this script (scancel --batch --signal=TERM, the time limit's --signal): stop the
# fleet the same way.
trap 'stop_all 143' TERM INT
"""


def render_sbatch(fleet: SlurmFleet) -> str:
    fleet.check()
    overrides = " ".join(_q(o) for o in fleet.overrides)  # a bash array: each override one word
    gpu_env = (
        "CUDA_VISIBLE_DEVICES=$(seq -s, $((i * GPUS_PER_WORKER)) "
        "$(((i + 1) * GPUS_PER_WORKER - 1)))"
        if fleet.gpus_per_node
        else ""
    )
    return f"""#!/bin/bash
# A dockyard fleet in one allocation, written by `dockyard launch slurm` (dockyard/launch/slurm.py).
# Submit with: sbatch THIS_FILE
# Stop it gracefully with: scancel --batch --signal=TERM JOBID (every role drains); a plain
# scancel kills the roles without their drain (nothing is lost: the next job resumes).
{chr(10).join(_headers(fleet))}
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
declare -A STEP_NAME=()  # srun pid -> its step's name (srun -J), for the shutdown
{_FUNCTIONS}
{_broker(fleet)}
# The trainer (with the dispatcher): one torchrun per trainer node, rendezvous on the first node.
# On SIGTERM torchrun gives its ranks the drain's time (not its own 30 s) to checkpoint, then
# exits 1 (its SignalException) though they drained.
srun --overlap --nodes="$TRAINER_NODES" --ntasks-per-node=1 -J trainer \\
    -w "$(IFS=,; echo "${{TRAINER_HOSTS[*]}}")" \\
    $TORCHRUN --nnodes="$TRAINER_NODES" --nproc_per_node="$RANKS_PER_NODE" \\
    --shutdown-timeout="$DRAIN_TIMEOUT_S" \\
    --rdzv_backend=c10d --rdzv_endpoint="$HEAD:{fleet.rendezvous_port}" --rdzv_id="$SLURM_JOB_ID" \\
    -m dockyard --log-format json trainer --config "$CONFIG" --run-dir "$RUN_DIR" \\
    "${{OVERRIDES[@]}}" \\
    data_plane.url="$NATS_URL" cluster.num_nodes="$TRAINER_NODES" \\
    cluster.gpus_per_node="$GPUS_PER_NODE" >"$RUN_DIR/logs/trainer.log" 2>&1 &
TRAINER_PID=$!
STEP_NAME[$TRAINER_PID]=trainer

# Rollout workers: {fleet.workers_on_each_node} on each rollout node (one per GPU or TP group).
for host in "${{ROLLOUT_HOSTS[@]}}"; do
    for ((i = 0; i < WORKERS_PER_NODE; i++)); do
        {gpu_env} srun --overlap --nodes=1 --ntasks=1 -w "$host" -J rollout \\
            $DOCKYARD --log-format json rollout --config "$CONFIG" --worker-id "$host-$i" \\
            "${{OVERRIDES[@]}}" data_plane.url="$NATS_URL" \\
            >"$RUN_DIR/logs/rollout-$host-$i.log" 2>&1 &
        STEP_NAME[$!]=rollout
    done
done

# The scorer pool, on the first node (CPU work; one durable consumer shared by all).
for ((j = 0; j < SCORERS; j++)); do
    srun --overlap --nodes=1 --ntasks=1 -w "$HEAD" -J scorer \\
        $DOCKYARD --log-format json score --config "$CONFIG" "${{OVERRIDES[@]}}" \\
        data_plane.url="$NATS_URL" >"$RUN_DIR/logs/scorer-$j.log" 2>&1 &
    STEP_NAME[$!]=scorer
done

# The run ends when the trainer does: drain every other role, then report the trainer's status.
wait "$TRAINER_PID"
TRAINER_STATUS=$?
unset "STEP_NAME[$TRAINER_PID]"
echo "trainer exited with $TRAINER_STATUS; stopping the fleet" >&2
stop_all "$TRAINER_STATUS"
"""
