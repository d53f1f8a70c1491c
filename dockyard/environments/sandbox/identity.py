"""Who a sandboxed run runs as, and how every process of a run is found and killed.

As root, each run (session) gets its own otherwise unused uid/gid (no passwd entry needed), so:
- ``RLIMIT_NPROC`` counts only that run's processes (root ignores RLIMIT_NPROC, and a shared
  ``nobody`` would share one budget between concurrent runs),
- files that are not world-readable (``/etc/shadow``, another user's 0600 files) are unreadable,
- "kill every process of the run" is ``kill(-1, SIGKILL)`` sent *as that uid*, which reaches
  processes that left the process group with ``setsid`` as well.

Without root none of this is available: the run keeps the caller's uid and only the process group
is killed (see the guarantee table in :mod:`dockyard.environments.sandbox`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dockyard.config.sections.env import SandboxLimits


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot be set up on this machine (no usable interpreter, setup failure)."""


@dataclass(frozen=True)
class RunIdentity:
    uid: int
    gid: int


def running_as_root() -> bool:
    return os.geteuid() == 0


class UidPool:
    """Hands out uids from ``[base, base + count)`` that no process currently uses."""

    def __init__(self, base: int, count: int) -> None:
        self._base, self._count = base, count
        self._in_use: set[int] = set()
        self._lock = threading.Lock()
        self._random = random.Random()

    def acquire(self) -> RunIdentity:
        for _ in range(64):
            uid = self._base + self._random.randrange(self._count)
            with self._lock:
                if uid in self._in_use:
                    continue
                self._in_use.add(uid)
            if not live_processes_of_uid(uid):  # another scorer process on this machine
                return RunIdentity(uid=uid, gid=uid)
            self.release(RunIdentity(uid, uid))
        raise SandboxUnavailableError("no free sandbox uid found in 64 tries")

    def release(self, identity: RunIdentity) -> None:
        with self._lock:
            self._in_use.discard(identity.uid)


_pools: dict[tuple[int, int], UidPool] = {}
_pools_lock = threading.Lock()


def uid_pool(limits: SandboxLimits) -> UidPool:
    key = (limits.sandbox_uid_base, limits.sandbox_uid_count)
    with _pools_lock:
        return _pools.setdefault(key, UidPool(*key))


def live_processes_of_uid(uid: int) -> list[int]:
    """Pids owned by ``uid``, zombies excluded (they hold no resources but a pid)."""
    return live_processes_in_uid_range(range(uid, uid + 1))


def live_processes_in_uid_range(uids: range) -> list[int]:
    """Pids owned by any uid in ``uids``, zombies excluded.

    ``/proc/<pid>`` is owned by the process's effective uid, so one ``stat`` per process finds
    candidates; only those get their state read.
    """
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid not in uids:
                continue
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # exited while we looked
        if state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def sandbox_uid_range(limits: SandboxLimits) -> range:
    return range(limits.sandbox_uid_base, limits.sandbox_uid_base + limits.sandbox_uid_count)


_KILL_BINARY = shutil.which("kill") or "/bin/kill"


def kill_everything_of(identity: RunIdentity, *, settle_timeout_s: float = 5.0) -> None:
    """SIGKILL every process running as ``identity`` and wait until none is left.

    ``kill(-1)`` from a process with that uid signals all of the uid's processes atomically
    (forks are blocked while the kernel walks the task list), so a fork bomb cannot outrun it.
    """
    deadline = time.monotonic() + settle_timeout_s
    # A uid with no live process has nobody left who could fork: nothing to kill. The scan is
    # sub-millisecond, spawning the killer is not.
    while live_processes_of_uid(identity.uid):
        subprocess.run(
            [_KILL_BINARY, "-9", "-1"],
            user=identity.uid,
            group=identity.gid,
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            env={},
        )
        if time.monotonic() > deadline:
            raise SandboxUnavailableError(f"processes of sandbox uid {identity.uid} survive")
        time.sleep(0.01)  # back-off between kill rounds, not synchronisation


def kill_process_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def world_can_execute(path: Path) -> bool:
    """Whether a uid that owns nothing here can execute ``path`` (every directory traversable)."""
    resolved = path.resolve()
    try:
        for directory in reversed(resolved.parents):
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(resolved).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IXOTH and mode & stat.S_IROTH)


def resolve_sandbox_python(limits: SandboxLimits, drops_privileges: bool) -> str:
    """The interpreter untrusted Python runs under; it must be usable by the sandbox uid.

    This one (``sys.executable``) is preferred, but e.g. a pyenv install under a 0700 ``/root``
    is not executable by an unprivileged uid, so a system ``python3`` is the fallback.
    """
    usable = world_can_execute if drops_privileges else (lambda p: os.access(p, os.X_OK))
    if limits.python_executable:
        configured = Path(limits.python_executable)
        if not usable(configured):
            raise SandboxUnavailableError(
                f"python_executable {configured} is not executable by the sandbox user"
            )
        return str(configured)
    candidates = [
        sys.executable,
        shutil.which("python3"),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    for candidate in candidates:
        if candidate and usable(Path(candidate)):
            return str(Path(candidate).resolve())
    raise SandboxUnavailableError(
        "no Python interpreter usable by the sandbox user; set env.<name>.limits.python_executable"
    )
