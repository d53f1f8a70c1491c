"""A corpus of hostile programs, each trying one way out as a policy under RL pressure would, and
each reporting on stdout what it got: ``ESCAPED ...`` for anything it should not have, ``blocked``
otherwise, ``done`` at the end (so a program that died early does not pass by saying nothing).

Classes and where the rest of the corpus lives (all run by ``.ci/run``; the kernel-isolation ones
skip, with the sandbox's own reason, only where it refuses to start):

- reads, writes, network, kernel surface: here, plus ``test_sandbox_isolation.py`` (private
  ``/tmp``/``/dev/shm``, whole-run disk quota, the ``ctypes`` socket, the seccomp filter);
- processes: ``test_sandbox_isolation.py`` (setuid exec, double-forked daemon, the scorer
  invisible), ``test_env_sandbox.py`` (fork bomb, process count, a ``setsid`` child);
- resources: ``test_sandbox_isolation.py`` (memory of the whole run), ``test_env_sandbox.py``
  and ``test_env_code.py`` (CPU, wall clock, output cap, memory);
- reward hacks: ``tests/integration/environments/test_swe_reward_hacks.py`` (the SWE scorer) and
  ``test_env_code.py`` (adversarial programs score 0).
"""

from __future__ import annotations

import socket
import textwrap
import uuid

import pytest
from sandbox_probes import requires_kernel_isolation, requires_root

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox import Sandbox

#: In the scorer's environment only: a program that finds it read the scorer's memory or environ.
_SECRET = f"dockyard-corpus-secret-{uuid.uuid4().hex}"
_ABSTRACT_SOCKET = f"dockyard-corpus-{uuid.uuid4().hex}"

# Indented like the programs below, which are dedented as a whole.
_CTYPES = """
        import ctypes, socket, struct
        libc = ctypes.CDLL(None, use_errno=True)
"""

CORPUS: dict[str, str] = {
    # reads: what only root, or only the scorer, may read
    "reads/etc-shadow": """
        try:
            open("/etc/shadow").read()
            print("ESCAPED read /etc/shadow")
        except OSError:
            print("blocked")
    """,
    "reads/root-home": """
        import os
        try:
            os.listdir("/root")
            print("ESCAPED listed /root")
        except OSError:
            print("blocked")
    """,
    "reads/scorer-environment": f"""
        import os
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            for name in ("environ", "cmdline"):
                try:
                    if {_SECRET!r}.encode() in open(f"/proc/{{pid}}/{{name}}", "rb").read():
                        found.append(pid)
                except OSError:
                    pass
        if {_SECRET!r} in str(os.environ):
            found.append("own environment")
        print(f"ESCAPED the scorer's secret via {{found}}" if found else "blocked")
    """,
    # writes: planting code that a later run, or the host, would pick up
    "writes/system-directories": """
        escaped = []
        for path in ("/usr/lib/sitecustomize.py", "/etc/dockyard-planted", "/var/tmp/planted",
                     "/root/planted", "/planted"):
            try:
                open(path, "w").write("import os")
                escaped.append(path)
            except OSError:
                pass
        print(f"ESCAPED wrote {escaped}" if escaped else "blocked")
    """,
    # network: past the Python guard with raw syscalls
    "network/udp-to-the-internet": _CTYPES
    + """
        fd = libc.socket(socket.AF_INET, socket.SOCK_DGRAM, 0)
        address = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(53), bytes([1, 1, 1, 1]))
        sent = libc.sendto(fd, b"x", 1, 0, address, len(address))
        print("ESCAPED sent a datagram" if sent == 1 else "blocked")
    """,
    "network/host-abstract-unix-socket": _CTYPES
    + f"""
        fd = libc.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0)
        name = b"\\0" + {_ABSTRACT_SOCKET!r}.encode()
        address = struct.pack("=H", socket.AF_UNIX) + name
        connected = libc.connect(fd, address, len(address)) == 0
        print("ESCAPED reached the host's abstract socket" if connected else "blocked")
    """,
    # kernel surface: the first steps of most local privilege escalations
    "kernel/user-namespace": _CTYPES
    + """
        print("ESCAPED made a user namespace" if libc.unshare(0x10000000) == 0 else "blocked")
    """,
    "kernel/ptrace-the-init": _CTYPES
    + """
        attached = libc.ptrace(16, 1, 0, 0) == 0  # PTRACE_ATTACH to the namespace's init
        print("ESCAPED traced pid 1" if attached else "blocked")
    """,
    "kernel/mount-over-proc": _CTYPES
    + """
        mounted = libc.mount(b"none", b"/proc", b"tmpfs", 0, None) == 0
        print("ESCAPED mounted over /proc" if mounted else "blocked")
    """,
}


@pytest.fixture(scope="module")
def host_listener():
    """What a program would reach if the network namespace let it: an abstract socket here."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + _ABSTRACT_SOCKET)
    listener.listen(8)
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(wall_time_s=10.0, cpu_time_s=8.0, memory_mb=256))


@requires_root
@requires_kernel_isolation
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_program_gets_nothing(
    name: str, sandbox: Sandbox, host_listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKYARD_CORPUS_SECRET", _SECRET)
    source = textwrap.dedent(CORPUS[name]) + '\nprint("done")\n'
    result = sandbox.run_python(source)
    assert result.ok, result.stderr.decode(errors="replace")
    assert result.stdout.decode().splitlines() == ["blocked", "done"]
