"""Sandboxed execution of untrusted programs, shared by the ``code`` and ``swe`` environments.

The isolation is the kernel's (docs/operations.md, "Isolation of one run"); as root, a run gets:

- bubblewrap (``jail.py``): new network, PID, mount, IPC and UTS namespaces; ``/`` read-only, a
  fresh ``/proc`` and minimal ``/dev``; no-new-privileges and ``nosuid`` mounts, so a setuid
  binary gains nothing; killing bubblewrap ends the PID namespace and every process in it.
- a cgroup per run (``cgroup.py``, v1 ``memory``+``pids`` or v2): memory and process count of
  the *whole* run; its member list is what "kill the run" kills until empty.
- one tmpfs of ``max_disk_mb`` per session (``jail.Workspace``): the work directory, ``/tmp``
  and ``/dev/shm``, the only writable places, discarded afterwards.
- its own uid/gid per session (``identity.py``): only world-readable files are readable.
- a seccomp filter (``seccomp.py``), loaded by bubblewrap before the program: new namespaces,
  mounts, ptrace, the keyring, eBPF, perf, io_uring, modules and the like are refused.
- rlimits (CPU, address space, file size, open files, processes), a wall clock, byte-capped
  output (``runner.py``).

Without bubblewrap's namespaces or a usable cgroup a :class:`Sandbox` refuses to start unless
``limits.allow_weak_isolation`` is set; then only rlimits, a bootstrap-made network namespace if
possible, the uid sweep and a Python audit hook (a diagnostic: ``ctypes`` passes it) apply.
Not given: protection against exploits of the syscalls the filter leaves open (it is a deny list
of the riskiest interfaces): use a VM or gVisor-style container around the scorers for hostile
workloads at scale.
"""

from dockyard.environments.sandbox import jail
from dockyard.environments.sandbox.identity import SandboxUnavailableError
from dockyard.environments.sandbox.runner import Isolation, Sandbox, SandboxResult, SandboxSession

__all__ = [
    "Isolation",
    "Sandbox",
    "SandboxResult",
    "SandboxSession",
    "SandboxUnavailableError",
    "jail",
]
