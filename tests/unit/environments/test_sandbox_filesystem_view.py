"""A run sees only the system's programs and libraries, its interpreter and its own directories.

Issue 41: with the host's whole tree bound read-only, a program could read the shipped dataset
(and print the stored answer) and connect to any world-connectable Unix socket on the host (the
network namespace does not cover filesystem sockets; on a systemd host, D-Bus and journald).
"""

from __future__ import annotations

import socket
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_probes import requires_kernel_isolation

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox import Sandbox

DATASET = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "program_bench.jsonl"


def _sandbox() -> Sandbox:
    return Sandbox(SandboxLimits(wall_time_s=10.0, cpu_time_s=8.0, memory_mb=256))


@pytest.fixture
def host_socket(host_dir: Path) -> Iterator[tuple[socket.socket, Path]]:
    """A listening Unix socket anyone may connect to, in a host directory outside /tmp."""
    path = host_dir / "service.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(4)
    server.setblocking(False)
    yield server, path
    server.close()


@requires_kernel_isolation
def test_the_shipped_dataset_is_not_in_the_runs_view() -> None:
    assert DATASET.is_file()  # the host has it, world-readable
    result = _sandbox().run_python(
        textwrap.dedent(
            f"""
            try:
                print(open({str(DATASET)!r}).read()[:20])
            except OSError as error:
                print(type(error).__name__)
            """
        )
    )
    assert result.ok, result.stderr
    assert result.stdout.decode().split() == ["FileNotFoundError"]


@requires_kernel_isolation
def test_a_host_unix_socket_outside_tmp_cannot_be_reached(
    host_socket: tuple[socket.socket, Path],
) -> None:
    server, path = host_socket
    # A fresh interpreter: the Python guard of run_python is a diagnostic, not the boundary.
    connect = textwrap.dedent(
        f"""
        import socket
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect({str(path)!r})
            print("connected")
        except OSError as error:
            print(type(error).__name__)
        """
    )
    result = _sandbox().run_python(
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {connect!r}])\n"
    )
    assert result.ok, result.stderr
    assert result.stdout.decode().split() == ["FileNotFoundError"]
    with pytest.raises(BlockingIOError):
        server.accept()  # nobody connected


@requires_kernel_isolation
def test_the_view_holds_system_paths_and_the_runs_own_only() -> None:
    result = _sandbox().run_python(
        "import os, sys\n"
        "print(' '.join(sorted(os.listdir('/'))))\n"
        "print(os.path.isdir(os.path.dirname(sys.executable)))\n"
        "print(os.path.exists('/run'), os.path.exists('/var'), os.path.exists('/root'))\n"
    )
    assert result.ok, result.stderr
    top, interpreter, host_dirs = result.stdout.decode().splitlines()
    # Merged /usr has bin, lib, ... as symlinks; /tmp holds the run's workspace path.
    assert set(top.split()) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32"} | {
        "proc",
        "sbin",
        "tmp",
        "usr",
    }
    assert interpreter == "True"
    assert host_dirs == "False False False"


@requires_kernel_isolation
def test_a_world_readable_host_file_outside_tmp_is_not_in_the_view(host_dir: Path) -> None:
    # Wherever this checkout lives (under /tmp its dataset is hidden by the private /tmp
    # anyway): a file anyone may read, in a host directory anyone may enter.
    answers = host_dir / "answers.jsonl"
    answers.write_text('{"output": "5"}\n')
    answers.chmod(0o644)
    result = _sandbox().run_python(
        f"try:\n    print(open({str(answers)!r}).read())\n"
        "except OSError as error:\n    print(type(error).__name__)\n"
    )
    assert result.ok, result.stderr
    assert result.stdout.decode().split() == ["FileNotFoundError"]
