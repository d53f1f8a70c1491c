"""The run's syscall filter: the kernel interfaces a scored program never needs, refused.

Namespaces, the cgroup and the uid bound what a run can *reach*; the kernel's syscall surface is
what a kernel exploit goes through. This filter (seccomp BPF, compiled by libseccomp through
``pyseccomp``, loaded by bubblewrap's ``--seccomp FD`` right before it execs the program, so
every process of the run inherits it and none can remove it) refuses, with ``EPERM``:

- new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag): a user
  namespace hands an unprivileged process the capabilities most kernel exploits start from;
- mounting and the new mount API, ``chroot``, ``pivot_root``;
- tracing and reading other processes (``ptrace``, ``process_vm_readv/writev``), ``kcmp``;
- the kernel keyring (``keyctl``, ``add_key``, ``request_key``);
- eBPF, ``perf_event_open``, ``userfaultfd`` and ``io_uring`` (the largest recent sources of
  local privilege escalations);
- kernel modules, ``kexec``, ``reboot``, swap, accounting, clocks, quotas, raw I/O ports,
  ``open_by_handle_at`` (a classic container escape) and ``syslog``.

``clone3`` passes its flags in memory, where seccomp cannot look, so it is answered ``ENOSYS``:
libc then falls back to ``clone``, whose flags the filter checks. A syscall of another
architecture (e.g. 32-bit ``int 0x80`` on x86-64, or x32) kills the process, libseccomp's default
for a foreign architecture, so the deny list cannot be side-stepped by syscall numbering.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile

from dockyard.environments.sandbox.identity import SandboxUnavailableError

#: Refused with EPERM (names as libseccomp knows them; absent ones on an architecture are skipped
#: by libseccomp itself, which resolves each name for the native architecture).
DENIED_SYSCALLS: tuple[str, ...] = (
    # namespaces
    "unshare",
    "setns",
    # mounts and root changes
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    # keyring
    "keyctl",
    "add_key",
    "request_key",
    # high-risk kernel surfaces
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # the machine itself
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "quotactl",
    "iopl",
    "ioperm",
    "open_by_handle_at",
    "name_to_handle_at",
    "syslog",
    "lookup_dcookie",
    "vhangup",
)

#: ``clone`` flags that make a namespace (``CLONE_NEWTIME`` shares its bit with the exit signal
#: in ``clone``'s flags, and is only accepted by ``unshare``/``clone3``, both refused anyway).
CLONE_NAMESPACE_FLAGS: tuple[int, ...] = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)


@functools.cache
def compiled_filter() -> bytes:
    """The filter as a BPF program (what ``bwrap --seccomp`` reads), built once per process.

    Raises :class:`SandboxUnavailableError` when libseccomp cannot be loaded.
    """
    try:
        import pyseccomp
    except (ImportError, OSError) as error:  # OSError: libseccomp.so.2 missing
        raise SandboxUnavailableError(
            f"seccomp: libseccomp is not usable ({error}); install libseccomp2 "
            "(scripts/ensure_system_packages.sh) and the pyseccomp package"
        ) from error
    denied = pyseccomp.ERRNO(errno.EPERM)
    syscall_filter = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        syscall_filter.add_rule(denied, name)
    for flag in CLONE_NAMESPACE_FLAGS:
        syscall_filter.add_rule(denied, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    syscall_filter.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as sink:
        syscall_filter.export_bpf(sink)  # libseccomp writes to the descriptor itself
        sink.seek(0)
        return sink.read()


def filter_fd(program: bytes) -> int:
    """A file descriptor positioned at the start of ``program`` (for ``--seccomp FD``)."""
    fd = os.memfd_create("dockyard-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
