"""A real one-host Slurm cluster for the launcher's end-to-end test: ``munged``, ``slurmctld`` and
``slurmd`` from Debian's ``munge`` and ``slurm-wlm`` (``scripts/ensure_system_packages.sh``
installs them), CPUs as the only resource.

Everything is private to one cluster: its own munge key and socket, its own ports, state, spool,
pid and log files, and a ``slurm.conf`` that the clients find through ``SLURM_CONF`` (in
:attr:`SlurmCluster.env`). No system service is touched. The daemons run in the foreground as
children of the test, and teardown cancels what is left of any job, then stops them.

Slurm needs root here (slurmd starts every job step as its user, and the config names root as
``SlurmUser``): without it the test is skipped with that reason. Missing binaries fail it: the
test setup installs them, so a missing one is a broken setup, not a reason to pass.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
#: Job states after which a job runs no more (squeue/scontrol's JobState).
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
)
_STARTED: list[subprocess.Popen[bytes]] = []


def _kill_started() -> None:  # pytest itself interrupted: leave no daemon behind
    for process in _STARTED:
        if process.poll() is None:
            process.kill()


atexit.register(_kill_started)


def require_slurm() -> None:
    """Fail when a binary is missing (the setup installs them); skip without root."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not found: the Slurm end-to-end test needs Debian's slurm-wlm "
            "and munge (scripts/ensure_system_packages.sh installs them, as root: apt-get "
            "install slurm-wlm munge)",
            pytrace=False,
        )
    if os.geteuid() != 0:
        pytest.skip("a one-host Slurm cluster needs root (slurmd starts job steps as their user)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def slurm_conf(root: Path, node: str, munge_socket: Path, ctld_port: int, slurmd_port: int) -> str:
    """The smallest slurm.conf that runs jobs on this host: one node with its CPUs, no cgroups,
    no accounting database (docs/deployment.md shows it). Root runs the daemons."""
    return f"""\
ClusterName=dockyardtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    root: Path
    node: str
    conf: Path
    env: dict[str, str] = field(repr=False)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=60, check=check
        )

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (one line, ``-o``), as a dict."""
        line = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(
            word.split("=", 1) for word in line.split() if "=" in word and not word.startswith("=")
        )

    def wait_for_job(self, job_id: str, timeout_s: float) -> dict[str, str]:
        """The job's fields once it has ended; cancelled and an AssertionError at the deadline."""
        deadline = time.monotonic() + timeout_s
        while (fields := self.job(job_id)).get("JobState") not in FINAL_STATES:
            if time.monotonic() > deadline:
                self.run("scancel", job_id, check=False)
                raise AssertionError(
                    f"job {job_id} still {fields.get('JobState')} after {timeout_s}s"
                )
            time.sleep(0.5)  # polling the job's state in slurmctld
        return fields

    def steps(self) -> list[str]:
        """Every job step Slurm knows of (``squeue --steps``), batch steps included."""
        listed = self.run("squeue", "-h", "-s", "-o", "%i %j").stdout
        return [line for line in listed.splitlines() if line.strip()]

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def _start(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    _STARTED.append(process)
    return process


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_idle(cluster: SlurmCluster, daemons: dict[str, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 60
    state = ""
    while state != "idle":
        for name, process in daemons.items():
            if process.poll() is not None:
                raise AssertionError(
                    f"{name} exited with {process.returncode}:\n"
                    f"{cluster.log('slurmctld.log')}\n{cluster.log('slurmd.log')}"
                )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"node {cluster.node} not idle after 60 s (state {state!r}):\n"
                f"{cluster.log('slurmctld.log')}\n{cluster.log('slurmd.log')}"
            )
        time.sleep(0.2)  # polling the node's state until slurmctld reports it idle
        done = cluster.run("sinfo", "-h", "-n", cluster.node, "-o", "%T", check=False)
        state = done.stdout.strip() if done.returncode == 0 else ""


def _cancel_everything(cluster: SlurmCluster) -> None:
    """A failed test may leave a job running: cancel it and wait until no step is left."""
    cluster.run("scancel", f"--user={pwd.getpwuid(os.geteuid()).pw_name}", check=False)
    deadline = time.monotonic() + 60
    while cluster.run("squeue", "-h", check=False).stdout.strip():
        if time.monotonic() > deadline:
            return
        time.sleep(0.5)  # polling squeue until the cancelled jobs are gone


@contextmanager
def slurm_cluster(root: Path) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd for this host, configured under ``root``; the node is idle
    when this yields."""
    require_slurm()
    node = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        # munged wants every directory above its socket searchable by all (pytest's tmp_path
        # is 0700), so the socket and the key live in a directory of their own under /tmp.
        munge_dir = Path(tempfile.mkdtemp(prefix="dockyard-munge-"))
        stack.callback(shutil.rmtree, munge_dir, True)
        munge_dir.chmod(0o755)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = munge_dir / "munge.socket"
        conf = root / "slurm.conf"
        conf.write_text(slurm_conf(root, node, munge_socket, free_port(), free_port()))
        env = {**os.environ, "SLURM_CONF": str(conf), "MUNGE_SOCKET": str(munge_socket)}
        cluster = SlurmCluster(root=root, node=node, conf=conf, env=env)
        log = root / "log"
        munged = _start(
            ["munged", "--foreground", f"--socket={munge_socket}", f"--key-file={key}",
             f"--log-file={log / 'munged.log'}", f"--pid-file={munge_dir / 'munged.pid'}",
             f"--seed-file={munge_dir / 'munged.seed'}"],
            log / "munged.out", env,
        )  # fmt: skip
        stack.callback(_stop, munged)
        _wait_for_socket(munge_socket, munged, log / "munged.out")
        daemons = {
            "slurmctld": _start(["slurmctld", "-D", "-i", "-f", str(conf)], log / "ctld.out", env),
            "slurmd": _start(
                ["slurmd", "-D", "-N", node, "-f", str(conf)], log / "slurmd.out", env
            ),
        }
        for daemon in daemons.values():
            stack.callback(_stop, daemon)
        stack.callback(_cancel_everything, cluster)  # runs first: jobs end before the daemons
        _wait_for_idle(cluster, daemons)
        yield cluster


def _wait_for_socket(path: Path, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"munged did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)  # polling for munged's socket
