"""Starting, watching, restarting and stopping the role processes of one run.

Every role is the same ``dockyard <role>`` command a user would start by hand on another
machine; the supervisor only adds the broker URL and a status directory. A role that dies
(crash, OOM kill, SIGKILL) is restarted, up to ``max_restarts`` times: the data plane makes that
safe (nothing acked is lost, nothing is trained twice). The run ends when the trainer exits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.fleet.threads import available_cpus, role_thread_env
from dockyard.fleet.trainer_ranks import torchrun_argv
from dockyard.observability.status_files import FINISHED, read_statuses
from dockyard.utils.logging import get_logger
from dockyard.utils.private_files import create_private_file, private_dir

log = get_logger(__name__)

#: A role's exit status when it refused its config or inputs at start-up (a missing dataset
#: file, an unreachable toolbox: dockyard.commands._common.EXIT_INVALID_CONFIG). Restarting
#: would only refuse again: the run ends with the role's own message.
EXIT_REFUSED = 2
#: The trainer's exit status when it starved (dockyard.commands._roles.EXIT_STARVED).
EXIT_STARVED = 3
#: How much of a role's log is searched for its error message.
ERROR_TAIL_BYTES = 64 * 1024
ERROR_MARK = "dockyard: error:"


class RoleProcessFailed(Exception):
    """A helper role that cannot run: refused at start-up, or died too often."""


def _terminate_with_parent() -> None:
    """In the child, before exec: SIGTERM this role if the supervisor dies, even by SIGKILL,
    so no orphaned role keeps running (Linux; elsewhere the supervisor's own cleanup applies)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


@dataclass
class RoleProcess:
    role: str
    instance: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.instance}"

    def start(self, env: dict[str, str]) -> None:
        private_dir(self.log_path.parent)
        create_private_file(self.log_path)
        handle = self.log_path.open("ab")
        # A new session: a terminal's Ctrl-C reaches the supervisor only, which then drains
        # the roles in order instead of every process dying at once.
        self.process = subprocess.Popen(
            self.argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
        )
        handle.close()

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def wait(self, timeout_s: float) -> int | None:
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def error_message(self) -> str:
        """The last error the role's command printed (``dockyard: error: ...`` and what
        follows it), or "" when its log has none."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(max(0, self.log_path.stat().st_size - ERROR_TAIL_BYTES))
                tail = handle.read().decode(errors="replace")
        except OSError:
            return ""
        start = tail.rfind(ERROR_MARK)
        if start < 0:
            return ""
        return tail[start + len(ERROR_MARK) :].strip()


class Supervisor:
    def __init__(
        self,
        config_path: Path,
        overrides: list[str],
        run_dir: Path,
        *,
        num_rollout_workers: int,
        num_scorers: int,
        max_restarts: int = 3,
        metrics_port: int | None = None,
        trainer_ranks: int = 1,
    ) -> None:
        """``trainer_ranks`` > 1: the trainer is that many data-parallel ranks under torchrun
        (one role: they start, fail and stop together; rank 0 writes the log's trainer lines
        and heartbeats)."""
        self.run_dir = run_dir
        self.status_dir = run_dir / "status"
        #: Set once the trainer is done: the helpers were asked to drain and are not restarted.
        self.draining = False
        self.max_restarts = max_restarts
        options = ["--log-format", "json"]
        base = [sys.executable, "-m", "dockyard", *options]

        def common(port_offset: int) -> list[str]:
            """The role's config, its overrides (its own metrics port among them: overrides are
            positional, so they come before any option), and where it writes its status."""
            port = []
            if metrics_port:  # roles of one machine must not share a port: N, N+1, ...
                port = [f"run.metrics_port={metrics_port + port_offset}"]
            config = ["--config", str(config_path), *overrides, *port]
            return [*config, "--status-dir", str(self.status_dir)]

        logs = run_dir / "logs"
        trainer_args = ["trainer", *common(0), "--run-dir", str(run_dir)]
        self.trainer = RoleProcess(
            "trainer",
            "0",
            [*base, *trainer_args]
            if trainer_ranks == 1
            else torchrun_argv(trainer_ranks, [*options, *trainer_args]),
            logs / "trainer.log",
        )
        self.workers = [
            RoleProcess(
                "rollout",
                str(i),
                [*base, "rollout", *common(1 + i), "--worker-id", f"w{i}"],
                logs / f"rollout-{i}.log",
            )
            for i in range(num_rollout_workers)
        ]
        self.scorers = [
            RoleProcess(
                "scorer",
                str(i),
                [
                    *base,
                    "score",
                    *common(1 + num_rollout_workers + i),
                    "--scorer-id",
                    f"s{i}",
                ],
                logs / f"scorer-{i}.log",
            )
            for i in range(num_scorers)
        ]
        # Several roles share the machine's cores: each gets its share (fleet/threads.py).
        roles = trainer_ranks + num_rollout_workers + num_scorers
        threads = role_thread_env(os.environ, roles, available_cpus())
        log.info("fleet.threads_per_role", roles=roles, env=threads)
        self.env = {**os.environ, **threads, "PYTHONUNBUFFERED": "1"}

    @property
    def roles(self) -> list[RoleProcess]:
        return [self.trainer, *self.workers, *self.scorers]

    def start(self) -> None:
        self._forget_previous_heartbeats()
        for role in self.roles:
            role.start(self.env)
            log.info(
                "fleet.started", role=role.name, pid=role.process.pid if role.process else None
            )

    def _forget_previous_heartbeats(self) -> None:
        """A previous run in this directory left its roles' heartbeats behind. The trainer
        reads them to tell starting roles from silent ones: a worker that was starting when
        that run ended (or one this run does not have) would be waited for until
        ``run.role_start_timeout_s``."""
        for path in self.status_dir.glob("*.json"):
            path.unlink(missing_ok=True)

    def check(self) -> int | None:
        """Restart dead helpers; the trainer's exit status once it has exited, else None."""
        code = self.trainer.poll()
        if code is not None:
            final = code in (0, EXIT_REFUSED, EXIT_STARVED)
            if final or self.trainer.restarts >= self.max_restarts:
                return code
            self._restart(self.trainer, code)
            return None
        if not self.draining and self._trainer_finished():
            # Its last step and checkpoint are written: what the helpers do now is never
            # trained, so they drain while the trainer process exits, not after it.
            self.draining = True
            log.info("fleet.draining", reason="the trainer finished")
            for role in [*self.workers, *self.scorers]:
                role.signal(signal.SIGTERM)
        for role in [*self.workers, *self.scorers]:
            role_code = role.poll()
            if role_code is None or self.draining:
                continue
            if role_code == EXIT_REFUSED:
                raise RoleProcessFailed(
                    f"{role.name} refused to start: {role.error_message() or '(no message)'} "
                    f"(see {role.log_path})"
                )
            if role.restarts >= self.max_restarts:
                raise RoleProcessFailed(
                    f"{role.name} died {role.restarts + 1} times (last exit {role_code}); "
                    f"see {role.log_path}"
                )
            self._restart(role, role_code)
        return None

    def _trainer_finished(self) -> bool:
        if not self.status_dir.exists():
            return False
        return any(
            s.role == "trainer" and s.state == FINISHED for s in read_statuses(self.status_dir)
        )

    def _restart(self, role: RoleProcess, code: int) -> None:
        role.exit_codes.append(code)
        role.restarts += 1
        log.warning("fleet.restarting", role=role.name, exit_code=code, restarts=role.restarts)
        role.start(self.env)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every role (they drain), then SIGKILL what is still running."""
        for role in self.roles:
            role.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for role in self.roles:
            if role.wait(max(0.1, deadline - time.monotonic())) is None:
                role.signal(signal.SIGKILL)
                role.wait(5.0)
