"""Escapes from one sandboxed run, tried as a policy under RL pressure would (issue #20, "Isolation
of one run"): one test per class of hole, each closed by the kernel (cgroup, namespaces,
no-new-privileges, one tmpfs), not by anything inside the sandboxed interpreter."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import textwrap
import uuid
from pathlib import Path

import pytest
from sandbox_probes import (
    processes_whose_cmdline_contains,
    requires_kernel_isolation,
    requires_root,
)

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox import Sandbox, SandboxUnavailableError, jail, runner

MIB = 1024 * 1024


def _sandbox(**limits: object) -> Sandbox:
    defaults = {"wall_time_s": 10.0, "cpu_time_s": 8.0, "memory_mb": 256, "max_processes": 16}
    return Sandbox(SandboxLimits(**{**defaults, **limits}))


def _run(sandbox: Sandbox, source: str):
    return sandbox.run_python(textwrap.dedent(source))


@requires_root
@requires_kernel_isolation
def test_memory_is_limited_for_the_whole_run_not_per_process() -> None:
    """A chain of processes, each holding 100 MiB (touched) while its child allocates the next:
    under a per-process limit of 200 MiB they hold 400 MiB together; the run's limit is 200."""
    result = _run(
        _sandbox(memory_mb=200),
        """
        import os

        def alive(pid):  # an ancestor that is exiting (PF_EXITING) or gone holds no block
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                return False
            return fields[0] not in "ZX" and not int(fields[6]) & 0x4

        holders = []
        for held in range(100, 500, 100):
            block = b"\\x01" * (100 << 20)  # every page written: resident, charged
            if all(alive(pid) for pid in holders):
                print(held, flush=True)
            holders.append(os.getpid())
            pid = os.fork()
            if pid:
                os.waitpid(pid, 0)  # keeps `block` resident while the child allocates
                os._exit(0)
            del block  # the child's copy-on-write view; it allocates its own next
        """,
    )
    held = [int(line) for line in result.stdout.split()]  # MiB held at once, when printed
    assert max(held, default=0) < 200, f"the run held {max(held)} MiB under a 200 MiB limit"
    assert result.memory_limit_exceeded and not result.cpu_limit_exceeded


@requires_root
@requires_kernel_isolation
def test_tmp_and_dev_shm_writes_are_private_and_discarded() -> None:
    marker = f"dockyard-probe-{uuid.uuid4().hex}"
    host_paths = [Path("/tmp", marker), Path("/dev/shm", marker), Path("/var/tmp", marker)]
    try:
        result = _run(
            _sandbox(),
            f"""
            for path in {[str(p) for p in host_paths]!r}:
                try:
                    with open(path, "wb") as handle:
                        handle.write(b"x" * (1 << 20))
                    print("wrote", path)
                except OSError as error:
                    print("refused", path, type(error).__name__)
            """,
        )
        assert result.ok, result.stderr
        # /tmp and /dev/shm are the run's own; other host directories are not in its view.
        assert result.stdout.decode().split("\n")[:3] == [
            f"wrote {host_paths[0]}",
            f"wrote {host_paths[1]}",
            f"refused {host_paths[2]} FileNotFoundError",
        ]
        assert [p for p in host_paths if p.exists()] == []
    finally:
        for path in host_paths:
            path.unlink(missing_ok=True)


@requires_root
@requires_kernel_isolation
def test_disk_quota_is_for_the_whole_run_not_per_file() -> None:
    """4 MiB files (under the 8 MiB per-file limit) into every writable place until refused:
    together they may not exceed the run's 16 MiB."""
    result = _run(
        _sandbox(max_disk_mb=16, max_file_size_mb=8),
        """
        import os
        written = 0
        for n in range(8):
            for directory in (os.getcwd(), "/tmp", "/dev/shm"):
                try:
                    with open(f"{directory}/fill-{n}", "wb") as handle:
                        handle.write(b"x" * (4 << 20))
                    written += 4 << 20
                except OSError:
                    pass
        print(written)
        """,
    )
    assert result.ok, result.stderr
    assert int(result.stdout) <= 16 * MIB


@pytest.fixture
def setuid_sleep(host_dir: Path) -> Path:
    """A setuid-root copy of ``sleep``: stands in for any setuid binary a run can make linger."""
    binary = host_dir / "sleep-setuid"
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", binary)
    os.chown(binary, 0, 0)
    binary.chmod(0o4755)
    return binary


@requires_root
@requires_kernel_isolation
def test_setuid_exec_gains_nothing_and_does_not_outlive_the_run(setuid_sleep: Path) -> None:
    duration = f"{uuid.uuid4().int % 100000 + 1000}.5"  # a unique argument to find it by
    try:
        # Its directory is bound into the run's view on purpose (the view hides the host's).
        sandbox = Sandbox(
            SandboxLimits(wall_time_s=10.0, cpu_time_s=8.0, memory_mb=256, max_processes=16),
            read_only_paths=[setuid_sleep.parent],
        )
        result = _run(
            sandbox,
            f"""
            import os
            status = open("/proc/self/status").read().splitlines()
            print([line for line in status if line.startswith("NoNewPrivs")][0].split()[1])
            if os.fork() == 0:
                os.setsid()  # leaves the process group too
                os.execv({str(setuid_sleep)!r}, ["sleep", {duration!r}])
            print("started")
            """,
        )
        assert result.ok, result.stderr
        assert result.stdout.split() == [b"1", b"started"]  # no-new-privileges was set
        assert processes_whose_cmdline_contains(duration.encode()) == []
    finally:
        for pid in processes_whose_cmdline_contains(duration.encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@requires_root
@requires_kernel_isolation
def test_run_cannot_see_or_signal_the_scorers_processes() -> None:
    scorer = os.getpid()
    result = _run(
        _sandbox(),
        f"""
        import os
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        cmdlines = b"".join(open(f"/proc/{{p}}/cmdline", "rb").read() for p in pids)
        print("sees-pytest" if b"pytest" in cmdlines else "sees-only-itself")
        if {scorer} in pids:
            print("same-number-is-its-own")  # pids are the namespace's own: not the scorer
        else:
            try:
                os.kill({scorer}, 0)
                print("signalled")
            except OSError:
                print("cannot-signal")
        """,
    )
    assert result.ok, result.stderr
    lines = result.stdout.decode().split()
    assert lines[0] == "sees-only-itself"
    assert lines[1] in ("cannot-signal", "same-number-is-its-own")


def test_refuses_untrusted_code_without_kernel_isolation_unless_opted_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A machine without bubblewrap (stood in for by an empty search path): the Python guard
    alone is no boundary, so the sandbox refuses to start unless the operator opts in."""
    monkeypatch.setattr(jail, "BWRAP_SEARCH_PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailableError, match="allow_weak_isolation"):
        Sandbox(SandboxLimits())
    weak = Sandbox(SandboxLimits(allow_weak_isolation=True))
    result = weak.run_python("print('ran')")
    assert result.stdout == b"ran\n"
    assert not result.isolation.namespaces


def test_refuses_to_start_without_the_syscall_filter_unless_opted_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A machine without libseccomp (stood in for by a compiler that cannot load it): the
    kernel's whole syscall surface would be open, so the sandbox refuses like for bubblewrap."""

    def no_libseccomp() -> bytes:
        raise SandboxUnavailableError("seccomp: libseccomp is not usable (stand-in)")

    monkeypatch.setattr(runner, "compiled_filter", no_libseccomp)
    with pytest.raises(SandboxUnavailableError, match=r"seccomp.*allow_weak_isolation"):
        Sandbox(SandboxLimits())
    weak = Sandbox(SandboxLimits(allow_weak_isolation=True))
    assert not weak.strong


_CTYPES_CONNECT = """
import ctypes, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)  # no audit hook sees this
address = struct.pack("=HH4s8x", socket.AF_INET, socket.htons({port}), bytes([127, 0, 0, 1]))
print("connected" if libc.connect(fd, address, len(address)) == 0 else "refused")
"""


@requires_root
@requires_kernel_isolation
def test_ctypes_socket_past_the_python_guard_reaches_nothing() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    try:
        port = server.getsockname()[1]
        result = _run(_sandbox(), _CTYPES_CONNECT.format(port=port))
        assert result.stdout == b"refused\n", result.stdout + result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


# Syscall numbers from the kernel's tables (arch/x86/entry/syscalls/syscall_64.tbl and
# include/uapi/asm-generic/unistd.h for arm64): the probe calls them raw, as an exploit would,
# so no libc wrapper can hide a refusal.
_SYSCALL_NUMBERS = {
    "x86_64": {"ptrace": 101, "unshare": 272, "setns": 308, "clone": 56, "clone3": 435,
               "mount": 165, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
               "io_uring_setup": 425, "init_module": 175, "userfaultfd": 323},
    "aarch64": {"ptrace": 117, "unshare": 97, "setns": 268, "clone": 220, "clone3": 435,
                "mount": 40, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
                "io_uring_setup": 425, "init_module": 105, "userfaultfd": 282},
}  # fmt: skip

_SECCOMP_PROBE = """
import ctypes, os, platform, signal
numbers = {numbers!r}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buffer = ctypes.create_string_buffer(256)
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17

def call(name, *args):
    ctypes.set_errno(0)
    result = libc.syscall(numbers[name], *args)
    if result == 0 and name == "clone":
        os._exit(0)  # the child of a clone that was let through
    if result > 0 and name == "clone":
        os.waitpid(result, 0)
    print(name, ctypes.get_errno() if result == -1 else "allowed", flush=True)

call("ptrace", 0, 0, 0, 0)  # PTRACE_TRACEME: allowed to anyone without a filter
call("unshare", CLONE_NEWUSER)  # a user namespace: capabilities for an unprivileged process
call("setns", -1, 0)
call("clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
call("clone3", buffer, 88)
call("mount", b"none", b"/tmp", b"tmpfs", 0, 0)
call("keyctl", 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
call("bpf", 5, buffer, 128)  # BPF_PROG_LOAD
call("perf_event_open", buffer, 0, -1, -1, 0)
call("io_uring_setup", 8, buffer)
call("init_module", buffer, 16, b"")
call("userfaultfd", 0)
"""


@requires_root
@requires_kernel_isolation
@pytest.mark.skipif(
    os.uname().machine not in _SYSCALL_NUMBERS, reason="syscall numbers known for x86_64, arm64"
)
def test_kernel_attack_surface_syscalls_are_refused_by_the_filter() -> None:
    """An exploit's first steps — a user namespace, tracing, the keyring, eBPF, perf, io_uring,
    modules — are refused with EPERM whatever the caller's privileges; ``clone3``, whose flags
    seccomp cannot read, is ENOSYS so libc falls back to the filtered ``clone``."""
    result = _run(_sandbox(), _SECCOMP_PROBE.format(numbers=_SYSCALL_NUMBERS))
    assert result.ok, result.stderr
    outcomes = dict(line.split() for line in result.stdout.decode().splitlines())
    eperm, enosys = str(errno.EPERM), str(errno.ENOSYS)
    expected = {name: eperm for name in _SYSCALL_NUMBERS["x86_64"]} | {"clone3": enosys}
    assert outcomes == expected
    assert result.isolation.seccomp


@requires_root
@requires_kernel_isolation
def test_ordinary_programs_still_run_under_the_filter() -> None:
    """Threads (clone3 falls back to clone), fork, a subprocess and /proc still work."""
    result = _run(
        _sandbox(),
        """
        import subprocess, threading
        seen = []
        thread = threading.Thread(target=lambda: seen.append("thread"))
        thread.start()
        thread.join()
        seen.append(subprocess.run(["echo", "child"], capture_output=True).stdout.decode().strip())
        print(*seen)
        """,
    )
    assert result.ok, result.stderr
    assert result.stdout == b"thread child\n"


@requires_root
@requires_kernel_isolation
def test_a_daemon_that_double_forks_and_ignores_signals_does_not_outlive_the_run() -> None:
    """The classic daemon escape: fork, ``setsid`` (new session and process group), fork again
    (reparented away from the program), ignore every catchable signal, exec something long.
    It is gone by the time ``run`` returns, while the session (and its uid) still exists, so
    neither the session's clean-up nor a uid sweep is what ended it."""
    marker = f"{uuid.uuid4().int % 100000 + 1000}.25"  # a unique argument to find it by
    sandbox = _sandbox()
    try:
        with sandbox.session() as session:
            session.write_file(
                "main.py",
                textwrap.dedent(
                    f"""
                    import os, signal
                    if os.fork() == 0:
                        os.setsid()
                        if os.fork() == 0:
                            for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                                signal.signal(number, signal.SIG_IGN)
                            os.execv("/bin/sleep", ["sleep", {marker!r}])
                        os._exit(0)
                    os.wait()
                    print("daemon started")
                    """
                ).encode(),
            )
            result = session.run_python("main.py")
            assert result.ok, result.stderr
            assert result.stdout == b"daemon started\n"
            assert processes_whose_cmdline_contains(marker.encode()) == []
    finally:
        for pid in processes_whose_cmdline_contains(marker.encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@requires_root
@requires_kernel_isolation
def test_a_sessions_files_stay_within_one_runs_memory_across_runs() -> None:
    # Each run writes 100 MiB (under its 128 MiB memory cap); the files stay in the session's
    # tmpfs after it. A second run must not be able to bring the session to 200 MiB.
    limits = SandboxLimits(memory_mb=128, max_disk_mb=1024, max_file_size_mb=256, wall_time_s=30)
    sandbox = Sandbox(limits)
    write = (
        "import sys\n"
        "written = 0\n"
        "try:\n"
        "    with open(sys.argv[1], 'wb') as out:\n"
        "        for _ in range(100):\n"
        "            out.write(b'x' * (1 << 20))\n"
        "            out.flush()\n"
        "            written += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print(written)\n"
    )
    with sandbox.session() as session:
        session.write_file("write.py", write.encode())
        first = session.run_python("write.py", args=["one.bin"])
        second = session.run_python("write.py", args=["two.bin"])
        held = sum(
            os.stat(Path(session.directory, name)).st_size for name in ("one.bin", "two.bin")
        )
    assert int(first.stdout) == 100, first.stderr
    assert int(second.stdout) < 100
    assert held <= 128 * MIB
