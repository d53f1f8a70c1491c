"""Runs in the sandbox child between fork and the untrusted program's exec. Stdlib only.

Started by :mod:`dockyard.environments.sandbox.runner` as
``python -I -S _bootstrap.py STATUS_FD UID GID CWD ISOLATE CGROUPS CPU AS FSIZE NOFILE NPROC ENV...
-- ARGV...``
(``UID``/``GID`` ``-`` to keep them; ``ISOLATE``: ``ns`` when bubblewrap already made the
namespaces, ``1`` to try a network namespace here, ``0`` for none; ``CGROUPS``: ``cgroup.procs``
files joined by ``:``, or ``-``; ``ENV`` as ``KEY=VALUE``; no json: its import alone costs more
than the rest of this script)
(a fresh single-threaded interpreter, so nothing here can deadlock on a lock another thread of
the scorer held at fork time, which is why this is not a ``preexec_fn``). In order:

1. joining the run's cgroups (memory and process count of the whole run; before anything else, so
   every process of the run is in them),
2. no-new-privileges (a setuid binary exec'd later runs as the run's uid, not root),
3. without bubblewrap only: a new network namespace (``unshare(CLONE_NEWNET)``: only a down
   loopback); as non-root, a new user namespace first, if the kernel allows,
4. resource limits (CPU, address space, file size, open files, processes, no core dumps),
5. the throwaway working directory and umask,
6. dropping root to the run's own uid/gid with no supplementary groups,
7. a one-line JSON report of what was achieved on the status pipe (closed by the exec),
8. ``execve`` of the program with a minimal environment.

Any failure is reported on the status pipe and the child exits 127 without running the program.
"""

import ctypes
import os
import resource
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
EXIT_SETUP_FAILED = 127


def _unshare(flags: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(flags) == 0


def _no_new_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _join_cgroups(procs_files: str) -> None:
    if procs_files != "-":
        for path in procs_files.split(":"):
            with open(path, "w") as procs:
                procs.write("0")  # "0": the writing process


def _isolate_network() -> str:
    if _unshare(CLONE_NEWNET):
        return "netns"
    if os.geteuid() != 0 and _unshare(CLONE_NEWUSER | CLONE_NEWNET):
        return "userns+netns"
    return "shared"


def _apply_limits(cpu_s: int, address_space: int, file_size: int, files: int, procs: int) -> None:
    # Soft limit sends SIGXCPU; the hard limit one second later is a SIGKILL.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    status_fd = int(sys.argv[1])
    os.set_inheritable(status_fd, False)  # closed by a successful exec: EOF means "running"
    try:
        uid, gid, cwd, isolate, cgroups = sys.argv[2:7]
        cpu_s, address_space, file_size, files, procs = (int(v) for v in sys.argv[7:12])
        separator = sys.argv.index("--", 12)
        env = dict(item.split("=", 1) for item in sys.argv[12:separator])
        argv = sys.argv[separator + 1 :]
        _join_cgroups(cgroups)
        _no_new_privileges()
        network = {"ns": "netns", "1": None, "0": "shared"}[isolate] or _isolate_network()
        _apply_limits(cpu_s, address_space, file_size, files, procs)
        os.chdir(cwd)
        os.umask(0o077)
        if uid != "-":
            os.setgroups([])
            os.setgid(int(gid))
            os.setuid(int(uid))
            if os.getuid() == 0 or os.geteuid() == 0:
                raise PermissionError("still root after setuid")
        os.write(status_fd, f"ok {network} {os.getuid()}\n".encode())
        os.execve(argv[0], argv, env)
    except BaseException as error:  # report everything: the parent must not run blind
        message = f"error {type(error).__name__}: {error}".replace("\n", " ")
        try:
            os.write(status_fd, (message + "\n").encode())
        finally:
            os._exit(EXIT_SETUP_FAILED)


if __name__ == "__main__":
    main()
