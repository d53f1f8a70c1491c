"""Sandboxed execution of untrusted programs, shared by the ``code`` and ``swe`` environments.

What a run gets on Linux (first as root, i.e. the scorer or sandbox service runs as root; then
without root):

- CPU time, address space, file size, open files, no core dumps: RLIMIT_*, set before exec.
- Wall clock: SIGKILL to the process group and to every process of the run's uid / process
  group only.
- Process count (fork bombs): RLIMIT_NPROC of a fresh uid per run / of *your* uid (shared).
- Processes outliving the run: none, ``kill -1`` as the run's uid also reaches ``setsid``
  escapees / escapees from the process group survive.
- Network: a new network namespace with no interface up (nothing reachable, not even
  127.0.0.1) / a user+network namespace if the kernel allows, else only a Python audit hook
  refusing non-Unix sockets (bypassed by a program that execs a non-Python binary).
- Files outside the work directory: only world-readable ones / all the user can read.
- Output: read with a byte cap per stream; the run is killed at the cap.
- Work directory: fresh, 0700, owned by the run, deleted afterwards.

Not given: a filesystem jail (world-readable files such as ``/etc/passwd`` and the interpreter's
stdlib are readable; world-writable ``/tmp`` is writable, though ``TMPDIR`` points at the work
directory), syscall filtering (no seccomp), and protection against kernel exploits. Use a VM or
container boundary around the sandbox service for hostile workloads.
"""

from dockyard.environments.sandbox.identity import SandboxUnavailableError
from dockyard.environments.sandbox.runner import Isolation, Sandbox, SandboxResult, SandboxSession

__all__ = ["Isolation", "Sandbox", "SandboxResult", "SandboxSession", "SandboxUnavailableError"]
