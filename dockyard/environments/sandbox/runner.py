"""Sandboxed subprocess runs with limits, a wall clock, byte-capped output and total cleanup.

Blocking API (callers in asyncio use ``asyncio.to_thread``; the HTTP sandbox service calls it
from its handler threads). A run never outlives :meth:`SandboxSession.run`: when the program
exits, times out, overflows its output cap, or ``cancel`` is set, every process of the run is
killed before ``run`` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox.cgroup import RunCgroup, detect_layout
from dockyard.environments.sandbox.identity import (
    RunIdentity,
    SandboxUnavailableError,
    kill_everything_of,
    kill_process_group,
    resolve_sandbox_python,
    running_as_root,
    uid_pool,
)
from dockyard.environments.sandbox.jail import (
    Workspace,
    bwrap_argv,
    drop_privileges_argv,
    find_bwrap,
    find_setpriv,
)
from dockyard.environments.sandbox.results_pipe import ResultsPipe
from dockyard.environments.sandbox.seccomp import compiled_filter, filter_fd
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_BOOTSTRAP = Path(__file__).with_name("_bootstrap.py")
_POLL_INTERVAL_S = 0.05
_READ_CHUNK = 65536
# How long pipes may stay open after the program exited and its processes were killed.
_DRAIN_GRACE_S = 1.0
_SETUP_TIMEOUT_S = 10.0
_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"

# Installed in every sandboxed *Python* program in front of the user's code. A diagnostic, not a
# boundary: ctypes, a fresh interpreter or patching it via ``gc`` gets past it; the isolation is
# the kernel's (namespaces, cgroup), and without it runs are refused unless the operator opts in.
_PYTHON_GUARD = """\
import sys
def _dockyard_guard(event, args):
    if event == "socket.__new__" and args[1] not in (1, -1):
        raise PermissionError("network access is disabled in the sandbox")
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
        raise PermissionError("network access is disabled in the sandbox")
sys.addaudithook(_dockyard_guard)
del _dockyard_guard
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class Isolation:
    """What the kernel actually granted this run (reported by the child before exec)."""

    network: str  # "netns", "userns+netns" or "shared" (Python guard only)
    uid: int
    privileges_dropped: bool  # ran under its own unprivileged uid
    #: bubblewrap: PID/mount/IPC namespaces, private /tmp and /dev/shm, no-new-privileges
    namespaces: bool = False
    cgroup: str = "none"  # "v1", "v2": memory and process count of the whole run; "none"
    seccomp: bool = False  # the syscall filter of ``seccomp.py`` was loaded before the program


@dataclass(frozen=True)
class SandboxResult:
    returncode: int  # negative: killed by that signal
    stdout: bytes
    stderr: bytes
    timed_out: bool  # wall clock or CPU limit
    output_limit_exceeded: bool
    cancelled: bool
    wall_time_s: float
    isolation: Isolation
    memory_limit_exceeded: bool = False  # the kernel OOM-killed a process of the run
    results: bytes = b""  # what the program wrote on its ResultsPipe, if it was given one
    results_overflowed: bool = False  # more than the pipe's cap (the run was killed then)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (
            self.timed_out or self.output_limit_exceeded or self.cancelled
        )

    @property
    def cpu_limit_exceeded(self) -> bool:
        killed = self.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
        return killed and not (self.cancelled or self.memory_limit_exceeded)


class _CappedBuffer:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflowed = False

    def add(self, data: bytes) -> None:
        room = self.cap - self.size
        if len(data) > room:
            self.overflowed = True
            data = data[: max(room, 0)]
        self.chunks.append(data)
        self.size += len(data)

    def value(self) -> bytes:
        return b"".join(self.chunks)


class Sandbox:
    """Runs untrusted programs under :class:`SandboxLimits`; one instance per environment."""

    def __init__(
        self,
        limits: SandboxLimits,
        *,
        scratch_root: Path | None = None,
        read_only_paths: Sequence[Path] = (),
    ) -> None:
        """``read_only_paths``: host directories a run sees (read-only) beyond the system's
        programs and libraries and the interpreter's prefix (``jail.filesystem_view``)."""
        self.limits = limits
        self.scratch_root = scratch_root
        self.drops_privileges = running_as_root()
        self.python = resolve_sandbox_python(limits, self.drops_privileges)
        self.read_only_paths = [
            *interpreter_roots(self.python),
            *(str(path.resolve()) for path in read_only_paths),
        ]
        self.bwrap = find_bwrap()
        self.setpriv = find_setpriv() if self.drops_privileges else None
        self.cgroups = detect_layout()
        missing = []
        self.seccomp: bytes | None = None
        try:
            self.seccomp = compiled_filter()
        except SandboxUnavailableError as error:
            missing.append(str(error))
        if self.bwrap is None:
            missing.append(
                "bubblewrap (bwrap) for namespaces; scripts/ensure_system_packages.sh installs it"
            )
        elif self.drops_privileges and self.setpriv is None:
            missing.append("setpriv (util-linux) to drop to the run's uid inside bubblewrap")
        elif self.seccomp is not None and (
            problem := _probe_bwrap(self.bwrap, self.setpriv, limits.sandbox_uid_base, self.seccomp)
        ):
            missing.append(f"namespaces: bwrap fails here ({problem})")
        if missing:
            self.bwrap = None
        if self.cgroups is None:
            missing.append("a writable cgroup (v1 memory+pids or v2) for the whole run's limits")
        if missing and not limits.allow_weak_isolation:
            raise SandboxUnavailableError(
                "refusing to run untrusted code without kernel isolation; missing: "
                + "; ".join(missing)
                + ". Set env.<name>.limits.allow_weak_isolation: true to run anyway (per-process "
                "rlimits and a Python-level network guard only)"
            )
        if missing:
            log.warning("sandbox.weak_isolation", missing=missing)
        self.strong = not missing

    @contextlib.contextmanager
    def session(self) -> Iterator[SandboxSession]:
        """A throwaway directory and (as root) a fresh uid, for one or more runs."""
        pool = uid_pool(self.limits) if self.drops_privileges else None
        identity = pool.acquire() if pool else None
        session: SandboxSession | None = None
        workspace: Workspace | None = None
        try:
            # A session's files outlive its runs, in RAM (tmpfs): bounded by the memory cap of
            # one run too, so no sequence of runs holds more than one run may (issue 41). A run
            # cannot write more than that anyway: its tmpfs pages are charged to its memory.
            size_mb = min(self.limits.max_disk_mb, self.limits.memory_mb)
            workspace = Workspace.create(self.scratch_root, size_mb * 1024 * 1024, identity)
            session = SandboxSession(self, workspace, identity)
            yield session
        finally:
            try:
                # With bubblewrap and a cgroup every run was killed whole before it returned.
                if identity and not self.strong and session_needs_sweep(session):
                    kill_everything_of(identity)
            finally:
                if workspace is not None:
                    workspace.remove()
                if pool and identity:
                    pool.release(identity)

    def run_python(
        self,
        source: str,
        *,
        stdin: bytes = b"",
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> SandboxResult:
        """Run ``source`` as ``main.py`` in a fresh session."""
        with self.session() as session:
            session.write_file("main.py", source.encode())
            return session.run_python("main.py", stdin=stdin, deadline=deadline, cancel=cancel)


def session_needs_sweep(session: SandboxSession | None) -> bool:
    return session is None or session._needs_sweep


class SandboxSession:
    def __init__(
        self, sandbox: Sandbox, workspace: Workspace, identity: RunIdentity | None
    ) -> None:
        self.sandbox = sandbox
        self.workspace = workspace
        self.directory = workspace.work
        self.identity = identity
        self._needs_sweep = False  # whether a run may have left processes behind

    def write_file(self, relative_path: str, data: bytes, mode: int = 0o600) -> Path:
        path = self.directory / relative_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, mode)
        self.give_to_sandbox(path)
        return path

    def give_to_sandbox(self, path: Path) -> None:
        """Make ``path`` (recursively) owned by the run's uid so the program can use it."""
        if not self.identity:
            return
        targets = [path]
        if path.is_dir() and not path.is_symlink():
            for root, directories, files in os.walk(path):
                targets.extend(Path(root, name) for name in (*directories, *files))
        for target in targets:
            os.lchown(target, self.identity.uid, self.identity.gid)

    def run_python(
        self,
        script: str,
        *,
        args: Sequence[str] = (),
        stdin: bytes = b"",
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> SandboxResult:
        argv = [self.sandbox.python, "-I", "-c", _PYTHON_GUARD, script, *args]
        return self.run(argv, stdin=stdin, deadline=deadline, cancel=cancel)

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        wall_time_s: float | None = None,
        deadline: float | None = None,
        cancel: threading.Event | None = None,
        results: ResultsPipe | None = None,
    ) -> SandboxResult:
        """Run ``argv`` (absolute ``argv[0]`` or a name on the base PATH) under the limits.

        The wall clock is ``min(limits.wall_time_s, wall_time_s, deadline - now)``. With
        ``results``, the program inherits its write end (at the same descriptor number) and
        what it writes there comes back as :attr:`SandboxResult.results`; the pipe is closed.
        """
        limits = self.sandbox.limits
        started = time.monotonic()
        wall = min(limits.wall_time_s, wall_time_s or float("inf"))
        if deadline is not None:
            wall = min(wall, max(deadline - started, 0.0))
        program = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0], path=_BASE_PATH)
        if program is None:
            raise SandboxUnavailableError(f"{argv[0]!r} not found on {_BASE_PATH}")
        strong = self.sandbox.strong
        child_env = {
            "PATH": _BASE_PATH,
            "HOME": str(self.directory),
            "TMPDIR": "/tmp" if strong else str(self.directory),  # private to the run if strong
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {}),
        }
        cgroup = None
        if strong:
            assert self.sandbox.cgroups is not None
            cgroup = RunCgroup.create(
                self.sandbox.cgroups, limits.memory_mb * 1024 * 1024, limits.max_processes
            )
        try:
            return self._start_and_supervise(
                program, argv, child_env, cwd, stdin, started, wall, cgroup, cancel, results
            )
        finally:
            if results is not None:
                results.close()
            if cgroup is not None:
                cgroup.remove()

    def _start_and_supervise(
        self,
        program: str,
        argv: Sequence[str],
        child_env: dict[str, str],
        cwd: Path | None,
        stdin: bytes,
        started: float,
        wall: float,
        cgroup: RunCgroup | None,
        cancel: threading.Event | None,
        results: ResultsPipe | None,
    ) -> SandboxResult:
        command = [program, *argv[1:]]
        self._needs_sweep = True
        inherited = () if results is None else (results.write_fd,)
        if cgroup is not None:
            process, isolation = self._spawn_jailed(command, child_env, cwd, cgroup, inherited)
        else:
            process, isolation = self._spawn_bootstrapped(command, child_env, cwd, inherited)
        if results is not None:
            results.close_write_end()
        try:
            result = self._supervise(
                process, stdin, started, wall, isolation, cancel, cgroup, results
            )
            if cgroup is not None and cgroup.oom_killed():
                return dataclasses.replace(result, memory_limit_exceeded=True)
            return result
        finally:
            self._kill_all(process, cgroup)
            if process.returncode is None:
                process.wait()

    def _spawn_jailed(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: Path | None,
        cgroup: RunCgroup,
        inherited: tuple[int, ...] = (),
    ) -> tuple[subprocess.Popen[bytes], Isolation]:
        """bubblewrap, held before its exec until it is in the run's cgroup with the rlimits.

        bubblewrap reports the pid of the namespace's init on ``--info-fd`` and waits on
        ``--block-fd``; the init is moved into the cgroup and given the rlimits then, so the
        program (its child) starts inside both. As root, ``setpriv`` drops to the session's uid
        (losing every capability) right before the program: no interpreter start in between.
        """
        sandbox, identity = self.sandbox, self.identity
        assert sandbox.bwrap is not None and sandbox.seccomp is not None
        seccomp_fd = filter_fd(sandbox.seccomp)
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        jail = bwrap_argv(
            sandbox.bwrap,
            self.workspace,
            as_root=sandbox.drops_privileges,
            read_only=sandbox.read_only_paths,
            options=[
                *("--info-fd", str(info_write), "--block-fd", str(block_read)),
                *("--seccomp", str(seccomp_fd)),
                *("--chdir", str(cwd or self.directory)),
            ],
        )
        if identity is not None:
            assert sandbox.setpriv is not None
            jail += drop_privileges_argv(sandbox.setpriv, identity)
        try:
            process = subprocess.Popen(
                [*jail, *command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(info_write, block_read, seccomp_fd, *inherited),
                start_new_session=True,  # its own process group, killed as a whole
                env=env,
                umask=0o077,
            )
        except BaseException:
            for fd in (info_read, block_write):
                os.close(fd)
            raise
        finally:
            for fd in (info_write, block_read, seccomp_fd):
                os.close(fd)
        try:
            init_pid = _read_child_pid(info_read, process)
            for procs in cgroup.procs_files:
                procs.write_text(f"{init_pid}\n")
            for limit, value in _rlimits(sandbox.limits):
                resource.prlimit(init_pid, limit, value)
            os.write(block_write, b"go")
        except BaseException:
            self._kill_all(process, cgroup)
            process.wait()
            raise
        finally:
            os.close(info_read)
            os.close(block_write)
        isolation = Isolation(
            network="netns" if sandbox.drops_privileges else "userns+netns",
            uid=identity.uid if identity else os.getuid(),
            privileges_dropped=identity is not None,
            namespaces=True,
            cgroup=cgroup.layout.version,
            seccomp=True,
        )
        return process, isolation

    def _spawn_bootstrapped(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: Path | None,
        inherited: tuple[int, ...] = (),
    ) -> tuple[subprocess.Popen[bytes], Isolation]:
        """Weak isolation: the stdlib bootstrap tries a network namespace, sets the rlimits,
        drops to the session's uid and execs the program."""
        limits = self.sandbox.limits
        status_read, status_write = os.pipe()
        identity = self.identity
        bootstrap_args = [
            str(status_write),
            str(identity.uid) if identity else "-",
            str(identity.gid) if identity else "-",
            str(cwd or self.directory),
            "1",  # try a network namespace
            str(max(1, round(limits.cpu_time_s))),
            str(limits.memory_mb * 1024 * 1024),
            str(limits.max_file_size_mb * 1024 * 1024),
            str(limits.max_open_files),
            str(limits.max_processes),
            *(f"{key}={value}" for key, value in env.items()),
            "--",
            *command,
        ]
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_BOOTSTRAP), *bootstrap_args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_write, *inherited),
                start_new_session=True,  # its own process group, killed as a whole
                env={},
            )
        finally:
            os.close(status_write)
        try:
            return process, self._read_status(status_read, process)
        except BaseException:
            self._kill_all(process, None)
            process.wait()
            raise
        finally:
            os.close(status_read)

    def _read_status(self, status_read: int, process: subprocess.Popen[bytes]) -> Isolation:
        report = _read_setup_report(status_read)
        words = report.decode(errors="replace").strip().split(" ", 2)
        if len(words) != 3 or words[0] != "ok":
            reason = report.decode(errors="replace").strip() or _setup_stderr(process)
            raise SandboxUnavailableError(f"sandbox setup failed: {reason}")
        uid = int(words[2])
        return Isolation(
            network=words[1],
            uid=uid,
            privileges_dropped=self.identity is not None and uid != 0,
        )

    def _supervise(
        self,
        process: subprocess.Popen[bytes],
        stdin: bytes,
        started: float,
        wall: float,
        isolation: Isolation,
        cancel: threading.Event | None,
        cgroup: RunCgroup | None,
        results: ResultsPipe | None = None,
    ) -> SandboxResult:
        cap = self.sandbox.limits.max_output_bytes
        buffers = {"stdout": _CappedBuffer(cap), "stderr": _CappedBuffer(cap)}
        if results is not None:
            buffers["results"] = _CappedBuffer(results.cap)
        assert process.stdin and process.stdout and process.stderr
        pending_input = memoryview(stdin)
        timed_out = cancelled = False
        drain_deadline: float | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ, "stdout")
            selector.register(process.stderr, selectors.EVENT_READ, "stderr")
            if results is not None:
                selector.register(results.read_fd, selectors.EVENT_READ, "results")
            if pending_input:
                os.set_blocking(process.stdin.fileno(), False)
                selector.register(process.stdin, selectors.EVENT_WRITE, "stdin")
            else:
                process.stdin.close()
            while selector.get_map():
                now = time.monotonic()
                if drain_deadline is None:
                    if now - started >= wall:
                        timed_out = True
                    elif cancel is not None and cancel.is_set():
                        cancelled = True
                    if timed_out or cancelled or any(b.overflowed for b in buffers.values()):
                        drain_deadline = now + _DRAIN_GRACE_S
                        self._kill_all(process, cgroup)
                    elif _has_exited(process):
                        # The program is done; nothing it left behind may keep running.
                        drain_deadline = now + _DRAIN_GRACE_S
                        self._kill_all(process, cgroup)
                elif now > drain_deadline:
                    break
                for key, _ in selector.select(timeout=_POLL_INTERVAL_S):
                    if key.data == "stdin":
                        try:
                            written = os.write(key.fd, pending_input[:_READ_CHUNK])
                        except (BrokenPipeError, OSError):
                            written = len(pending_input)
                        pending_input = pending_input[written:]
                        if not pending_input:
                            selector.unregister(key.fileobj)
                            process.stdin.close()
                        continue
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    buffers[key.data].add(chunk)
        for stream in (process.stdin, process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                stream.close()
        # The leader is not reaped yet, so its group id is still ours.
        self._kill_all(process, cgroup)
        returncode = process.wait()
        if cgroup is not None and returncode > 128:
            # bubblewrap exits 128+n for a program killed by signal n (the shell convention).
            returncode = 128 - returncode
        return SandboxResult(
            returncode=returncode,
            stdout=buffers["stdout"].value(),
            stderr=buffers["stderr"].value(),
            timed_out=timed_out or returncode == -signal.SIGXCPU,
            output_limit_exceeded=buffers["stdout"].overflowed or buffers["stderr"].overflowed,
            cancelled=cancelled,
            wall_time_s=time.monotonic() - started,
            isolation=isolation,
            results=buffers["results"].value() if results is not None else b"",
            results_overflowed=results is not None and buffers["results"].overflowed,
        )

    def _kill_all(self, process: subprocess.Popen[bytes], cgroup: RunCgroup | None) -> None:
        """SIGKILL the process group and every process of the run; reap nothing.

        The group is only signalled while its leader is unreaped (a zombie still owns the group
        id), so a recycled pid can never make this hit an unrelated process group. The group
        holds bubblewrap, whose death ends the PID namespace (the kernel kills all of it); the
        cgroup lists whatever is left. Without them (weak isolation), as root, every process
        of the run's uid is killed instead, which misses a setuid exec.
        """
        if process.returncode is None:
            kill_process_group(process.pid)
        if cgroup is not None:
            cgroup.kill_all()
        elif self.identity and self._needs_sweep:
            kill_everything_of(self.identity)
            self._needs_sweep = False


@functools.cache
def interpreter_roots(python: str) -> tuple[str, ...]:
    """The directories ``python`` needs to start and import its stdlib and site-packages (its
    prefixes and its executable's directory), for the run's filesystem view."""
    probe = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import sys; print('\\n'.join({sys.prefix, sys.base_prefix, sys.exec_prefix,"
            " sys.base_exec_prefix}))",
        ],
        capture_output=True,
        env={},
        check=False,
        timeout=_SETUP_TIMEOUT_S,
    )
    if probe.returncode != 0:
        raise SandboxUnavailableError(f"{python} does not start: {probe.stderr[-300:]!r}")
    roots = {os.path.dirname(os.path.realpath(python)), os.path.dirname(python)}
    roots.update(line for line in probe.stdout.decode().splitlines() if line)
    return tuple(sorted(os.path.realpath(root) for root in roots))


def _has_exited(process: subprocess.Popen[bytes]) -> bool:
    """Exit check that leaves the child unreaped (``WNOWAIT``), unlike ``Popen.poll``."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _setup_stderr(process: subprocess.Popen[bytes]) -> str:
    """What bubblewrap (or the interpreter) said when it failed before the bootstrap reported."""
    try:
        process.wait(timeout=_SETUP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "no status from the sandbox child"
    assert process.stderr is not None
    said = process.stderr.read(4096).decode(errors="replace").strip()
    return said or f"the sandbox child exited {process.returncode} without a status"


@functools.cache
def _probe_bwrap(bwrap: str, setpriv: str | None, probe_uid: int, seccomp: bytes) -> str | None:
    """Why bubblewrap (and, as root, ``setpriv`` to a sandbox uid) cannot run a program with
    the run's namespaces and syscall filter here (``None``: it can)."""
    seccomp_fd = filter_fd(seccomp)
    with tempfile.TemporaryDirectory(prefix="dockyard-bwrap-probe-") as directory:
        workspace = Workspace(Path(directory), mounted=False)
        for path in (workspace.work, workspace.tmp, workspace.shm):
            path.mkdir()
        argv = bwrap_argv(
            bwrap, workspace, as_root=setpriv is not None, options=["--seccomp", str(seccomp_fd)]
        )
        if setpriv is not None:
            argv += drop_privileges_argv(setpriv, RunIdentity(probe_uid, probe_uid))
        try:
            probe = subprocess.run(
                [*argv, "/bin/true"],
                capture_output=True,
                env={},
                check=False,
                pass_fds=(seccomp_fd,),
            )
        finally:
            os.close(seccomp_fd)
    if probe.returncode != 0:
        return probe.stderr.decode(errors="replace").strip() or f"exit {probe.returncode}"
    return None


def _rlimits(limits: SandboxLimits) -> list[tuple[int, tuple[int, int]]]:
    """The per-process limits of a run (the bootstrap sets the same ones in weak isolation)."""
    cpu_s = max(1, round(limits.cpu_time_s))
    address_space = limits.memory_mb * 1024 * 1024
    file_size = limits.max_file_size_mb * 1024 * 1024
    return [
        # Soft limit sends SIGXCPU; the hard limit one second later is a SIGKILL.
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
        (resource.RLIMIT_AS, (address_space, address_space)),
        (resource.RLIMIT_FSIZE, (file_size, file_size)),
        (resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files)),
        (resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


def _read_setup_report(fd: int, *, complete: Callable[[bytes], bool] | None = None) -> bytes:
    """What a setup step writes on ``fd``: read until it closes, ``complete(report)`` holds, or
    ``_SETUP_TIMEOUT_S`` passes (a setup that hangs must not hang the scorer)."""
    report = b""
    deadline = time.monotonic() + _SETUP_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=deadline - time.monotonic()):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            report += chunk
            if complete is not None and complete(report):
                break
    return report


def _child_pid(report: bytes) -> int | None:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return int(json.loads(report)["child-pid"])
    return None


def _read_child_pid(info_read: int, process: subprocess.Popen[bytes]) -> int:
    """The pid bubblewrap reports on ``--info-fd`` once the namespaces exist."""
    pid = _child_pid(
        _read_setup_report(info_read, complete=lambda report: _child_pid(report) is not None)
    )
    if pid is None:
        raise SandboxUnavailableError(f"sandbox setup failed: {_setup_stderr(process)}")
    return pid
