"""One cgroup per sandboxed run: memory and process count of the *whole* run, and killing it.

``RLIMIT_AS``/``RLIMIT_NPROC`` bound each process (or uid), not the run: five children each under
a 512 MiB address-space limit hold 2.5 GiB together. A cgroup charges every page (anonymous,
page cache, tmpfs) of every process in it to one limit, and lists every member, however it got
there (``setsid``, a setuid exec), so "kill the run" is "kill every pid the cgroup lists".

Both hierarchies are supported, detected once from ``/proc/self/mountinfo``:

- cgroup v1: the ``memory`` and ``pids`` controllers, each mounted on its own hierarchy; the
  run's group is created under this process's own group in each.
- cgroup v2 (unified): one group under this process's own, which must have ``memory`` and
  ``pids`` in its ``cgroup.subtree_control`` (a delegated cgroup, e.g. systemd ``Delegate=yes``,
  with the scorer's own processes in a leaf: the "no internal processes" rule).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dockyard.environments.sandbox.identity import SandboxUnavailableError
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_PREFIX = "dockyard-sandbox-"


@dataclass(frozen=True)
class CgroupLayout:
    version: Literal["v1", "v2"]
    #: v1: this process's group in the memory and the pids hierarchy; v2: its one group.
    parents: tuple[Path, ...]


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fstype, super options) of every cgroup mount."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_groups() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's group path, from ``/proc/self/cgroup``."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups


def _group_dir(root: str, mount_point: str, path: str) -> Path | None:
    # The mount shows the hierarchy from ``root`` down (a container sees only its own subtree).
    if root == "/":
        return Path(mount_point + path)
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return Path(mount_point + path[len(root.rstrip("/")) :])
    return None


@functools.cache
def detect_layout() -> CgroupLayout | None:
    """Where run cgroups can be made here, or ``None`` (no usable, writable memory+pids)."""
    try:
        mounts, own = _mounts(), _own_groups()
    except OSError:
        return None
    for root, point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        directory = _group_dir(root, point, own[""])
        try:
            available = set(Path(point, "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if directory and {"memory", "pids"} <= available and os.access(directory, os.W_OK):
            return CgroupLayout("v2", (directory,))
    v1 = {}
    for root, point, fstype, options in mounts:
        for controller in ("memory", "pids"):
            if fstype == "cgroup" and controller in options and controller in own:
                directory = _group_dir(root, point, own[controller])
                if directory and os.access(directory, os.W_OK):
                    v1[controller] = directory
    if len(v1) == 2:
        return CgroupLayout("v1", (v1["memory"], v1["pids"]))
    return None


class RunCgroup:
    """The cgroup(s) of one run; the bootstrap joins them by writing to :attr:`procs_files`."""

    def __init__(self, layout: CgroupLayout, directories: tuple[Path, ...]) -> None:
        self.layout = layout
        self.directories = directories

    @classmethod
    def create(cls, layout: CgroupLayout, memory_bytes: int, max_pids: int) -> RunCgroup:
        name = _PREFIX + uuid.uuid4().hex[:16]
        directories = tuple(parent / name for parent in layout.parents)
        group = cls(layout, ())
        try:
            if layout.version == "v2":
                _enable_v2_controllers(layout.parents[0])
            for directory in directories:
                directory.mkdir(mode=0o755)
                group.directories = (*group.directories, directory)
            if layout.version == "v2":
                _write(directories[0] / "memory.max", memory_bytes)
                _write(directories[0] / "memory.swap.max", 0, optional=True)
                _write(directories[0] / "pids.max", max_pids)
            else:
                memory, pids = directories
                _write(memory / "memory.limit_in_bytes", memory_bytes)
                # memsw >= limit_in_bytes, so it is set second; equal: no swapping past it.
                _write(memory / "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                _write(pids / "pids.max", max_pids)
        except OSError as error:
            group.remove(settle_timeout_s=1.0)
            raise SandboxUnavailableError(f"cannot create the run's cgroup: {error}") from error
        return group

    @property
    def procs_files(self) -> list[Path]:
        return [directory / "cgroup.procs" for directory in self.directories]

    def members(self) -> set[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(pid) for pid in procs.read_text().split())
        return pids

    def kill_all(self, *, settle_timeout_s: float = 5.0) -> None:
        """SIGKILL every member until none is left (members forked meanwhile included)."""
        deadline = time.monotonic() + settle_timeout_s
        kill_file = self.directories[0] / "cgroup.kill" if self.layout.version == "v2" else None
        killed: set[int] = set()
        while members := self.members():
            if kill_file is not None and kill_file.exists():
                _write(kill_file, 1)  # atomic against forks
            else:
                for pid in members:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            killed |= members
            if time.monotonic() > deadline:
                raise SandboxUnavailableError(f"processes of the run survive: {sorted(members)}")
            time.sleep(0.002)  # back-off while the kernel tears the killed tasks down
        # A task leaves its cgroup early in exit, before it releases everything; wait for that.
        while (exiting := [pid for pid in killed if _still_exiting(pid)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.002)
        if exiting:
            log.warning("sandbox.cgroup.slow_exit", pids=exiting)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for exceeding the memory limit."""
        name = "memory.events" if self.layout.version == "v2" else "memory.oom_control"
        try:
            lines = (self.directories[0] / name).read_text().splitlines()
        except OSError:
            return False
        counts = dict(line.split() for line in lines if len(line.split()) == 2)
        return int(counts.get("oom_kill", "0")) > 0

    def remove(self, *, settle_timeout_s: float = 5.0) -> None:
        """Kill what is left and delete the group(s)."""
        if self.directories:
            self.kill_all(settle_timeout_s=settle_timeout_s)
        deadline = time.monotonic() + settle_timeout_s
        for directory in self.directories:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as error:
                    # EBUSY while the last killed task is still being released by the kernel.
                    if error.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise SandboxUnavailableError(
                            f"cannot remove the run's cgroup {directory}: {error}"
                        ) from error
                    time.sleep(0.002)
        self.directories = ()


def _still_exiting(pid: int) -> bool:
    """Whether ``pid`` exists and is not yet a zombie (its memory and files not yet released)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _enable_v2_controllers(parent: Path) -> None:
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    missing = {"memory", "pids"} - enabled
    if missing:
        try:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(missing)))
        except OSError as error:
            raise SandboxUnavailableError(
                f"cgroup v2: enable {sorted(missing)} in {parent}/cgroup.subtree_control (run the "
                f"scorer in a delegated cgroup, its own processes in a leaf): {error}"
            ) from error


def _write(path: Path, value: object, *, optional: bool = False) -> None:
    if optional and not path.exists():
        return
    path.write_text(f"{value}\n")
