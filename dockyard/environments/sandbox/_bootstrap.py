"""Runs in the sandbox child between fork and the untrusted program's exec. Stdlib only.

Started by :mod:`dockyard.environments.sandbox.runner` as
``python -I -S _bootstrap.py STATUS_FD UID GID CWD ISOLATE CPU AS FSIZE NOFILE NPROC ENV... --
ARGV...`` for *weak* isolation only (``limits.allow_weak_isolation`` where bubblewrap or a cgroup
is missing; with them the runner uses bubblewrap and ``setpriv`` instead)
(``UID``/``GID`` ``-`` to keep them; ``ISOLATE`` ``1`` to try a network namespace;
``ENV`` as ``KEY=VALUE``; no json: its import alone costs more
than the rest of this script)
(a fresh single-threaded interpreter, so nothing here can deadlock on a lock another thread of
the scorer held at fork time, which is why this is not a ``preexec_fn``). In order:

1. no-new-privileges (a setuid binary exec'd later runs as the run's uid, not root),
2. a new network namespace (``unshare(CLONE_NEWNET)``: only a down loopback); as non-root, a new
   user namespace first, if the kernel allows,
3. resource limits (CPU, address space, file size, open files, processes, no core dumps),
4. the throwaway working directory and umask,
5. dropping root to the run's own uid/gid with no supplementary groups,
6. a one-line JSON report of what was achieved on the status pipe (closed by the exec),
7. ``execve`` of the program with a minimal environment.

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
    result: int = libc.unshare(flags)  # ctypes' default restype: a C int
    return result == 0


def _no_new_privileges() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


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
        uid, gid, cwd, isolate = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
        cpu_s, address_space, file_size, files, procs = (int(v) for v in sys.argv[6:11])
        separator = sys.argv.index("--", 11)
        env = dict(item.split("=", 1) for item in sys.argv[11:separator])
        argv = sys.argv[separator + 1 :]
        _no_new_privileges()
        network = _isolate_network() if isolate else "shared"
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
