"""The sandbox against hostile programs. Every child is bounded before exec (RLIMIT_*, its own
uid as root, its own network namespace); the conftest fixture checks no process survives."""

from __future__ import annotations

import os
import socket
import stat
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sandbox_probes import live_sandbox_processes, requires_kernel_isolation, requires_root

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox import Sandbox

pytestmark = requires_kernel_isolation


def _sandbox(**limits: float) -> Sandbox:
    defaults = {"wall_time_s": 3.0, "cpu_time_s": 2.0, "memory_mb": 256, "max_processes": 16}
    return Sandbox(SandboxLimits(**{**defaults, **limits}))


def _run(sandbox: Sandbox, source: str, **kwargs):
    return sandbox.run_python(textwrap.dedent(source), **kwargs)


def test_runs_a_program_with_stdin_in_a_private_throwaway_directory() -> None:
    result = _run(
        _sandbox(),
        """
        import os, stat
        print(input()[::-1])
        print(os.getcwd())
        print(oct(stat.S_IMODE(os.stat('.').st_mode)))
        open('scratch.txt', 'w').write('x')
        """,
        stdin=b"olleh\n",
    )
    assert result.ok, result.stderr
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "hello"
    assert lines[2] == "0o700"
    assert not Path(lines[1]).exists()  # the working directory is gone after the run


def test_infinite_loop_is_killed_at_the_wall_clock() -> None:
    started = time.monotonic()
    result = _run(_sandbox(wall_time_s=1.0, cpu_time_s=30), "while True:\n    pass\n")
    elapsed = time.monotonic() - started
    assert result.timed_out and not result.ok
    assert result.returncode is not None and result.returncode < 0
    assert elapsed < 4.0


def test_sleeping_program_is_killed_at_the_wall_clock_not_cpu() -> None:
    result = _run(_sandbox(wall_time_s=0.8), "import time\ntime.sleep(60)\n")
    assert result.timed_out
    assert result.wall_time_s < 3.0


def test_cpu_limit_kills_a_busy_program_before_a_long_wall_clock() -> None:
    result = _run(_sandbox(wall_time_s=20.0, cpu_time_s=1.0), "while True:\n    pass\n")
    assert result.timed_out
    assert result.cpu_limit_exceeded
    assert result.wall_time_s < 8.0


def test_memory_hog_hits_the_address_space_limit() -> None:
    result = _run(
        _sandbox(memory_mb=200),
        """
        chunks = []
        try:
            while True:
                chunks.append(bytearray(10 * 1024 * 1024))
        except MemoryError:
            print(len(chunks) * 10)
        """,
    )
    assert result.ok, result.stderr
    assert int(result.stdout) < 200  # MB actually obtained before the limit refused more


def test_one_gigabyte_print_is_cut_at_the_output_cap() -> None:
    started = time.monotonic()
    result = _run(
        _sandbox(max_output_bytes=100_000, wall_time_s=10.0),
        """
        import sys
        block = 'x' * 65536
        for _ in range(16384):  # 1 GiB
            sys.stdout.write(block)
        """,
    )
    assert result.output_limit_exceeded and not result.ok
    assert len(result.stdout) == 100_000
    assert time.monotonic() - started < 5.0  # killed at the cap, not after 1 GiB


def test_fork_bomb_is_bounded_and_fully_killed() -> None:
    result = _run(
        _sandbox(max_processes=8, wall_time_s=1.5),
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
    )
    assert result.timed_out
    assert live_sandbox_processes() == []


@requires_root
def test_process_count_is_limited_per_run() -> None:
    result = _run(
        _sandbox(max_processes=6),
        """
        import os, time
        started = refused = 0
        for _ in range(50):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                started += 1
            except OSError:
                refused += 1
        print(started, refused)
        """,
    )
    started, refused = map(int, result.stdout.split())
    assert started < 6 and refused > 40
    assert result.isolation.privileges_dropped


def test_background_process_that_leaves_the_session_is_killed() -> None:
    result = _run(
        _sandbox(),
        """
        import os, time
        if os.fork() == 0:
            os.setsid()  # leaves the sandbox's process group
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        time.sleep(0.2)
        print('parent done')
        """,
    )
    assert result.ok, result.stderr
    assert live_sandbox_processes() == []


@requires_root
def test_cannot_read_private_files_outside_the_sandbox(host_dir: Path) -> None:
    secret = host_dir / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    os.chmod(secret, stat.S_IRUSR | stat.S_IWUSR)  # 0600, owned by the test's (root) uid
    # host_dir is bound into this run's view on purpose: the uid, not the view, must refuse it.
    limits = SandboxLimits(wall_time_s=3.0, cpu_time_s=2.0, memory_mb=256, max_processes=16)
    result = _run(
        Sandbox(limits, read_only_paths=[host_dir]),
        f"""
        for path in ({str(secret)!r}, '/etc/shadow'):
            try:
                print(open(path).read())
            except PermissionError:
                print('denied', path)
            except FileNotFoundError:
                print('absent', path)
        """,
    )
    assert result.ok, result.stderr
    assert b"TOP-SECRET-VALUE" not in result.stdout
    # /etc/shadow is not in the run's filesystem view at all.
    assert result.stdout.decode().splitlines() == [f"denied {secret}", "absent /etc/shadow"]
    assert result.isolation.privileges_dropped and result.isolation.uid != 0


@pytest.fixture
def listener() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def _assert_nobody_connected(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()


_CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as error:
    print("refused", type(error).__name__)
"""


def test_python_program_cannot_open_a_socket(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    result = _run(_sandbox(), _CONNECT.format(port=port))
    assert result.stdout.startswith(b"refused"), result.stdout + result.stderr
    _assert_nobody_connected(listener)


@requires_root
def test_network_namespace_blocks_even_unguarded_programs(listener: socket.socket) -> None:
    """``session.run`` of a raw interpreter has no audit hook: only the namespace stops it."""
    sandbox = _sandbox()
    port = listener.getsockname()[1]
    with sandbox.session() as session:
        script = session.write_file("connect.py", _CONNECT.format(port=port).encode())
        result = session.run([sandbox.python, "-I", str(script)])
    assert result.isolation.network == "netns"
    assert result.stdout.startswith(b"refused"), result.stdout + result.stderr
    _assert_nobody_connected(listener)


def test_cancel_stops_a_run_promptly() -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.5, cancel.set)
    timer.start()
    try:
        result = _run(
            _sandbox(wall_time_s=30.0, cpu_time_s=30), "while True:\n    pass\n", cancel=cancel
        )
    finally:
        timer.cancel()
    assert result.cancelled and not result.ok
    assert result.wall_time_s < 3.0


def test_deadline_caps_the_wall_clock() -> None:
    result = _run(
        _sandbox(wall_time_s=30.0, cpu_time_s=30),
        "while True:\n    pass\n",
        deadline=time.monotonic() + 0.5,
    )
    assert result.timed_out and result.wall_time_s < 3.0


def test_session_runs_share_a_directory() -> None:
    sandbox = _sandbox()
    with sandbox.session() as session:
        first = session.run([sandbox.python, "-I", "-c", "open('f', 'w').write('kept')"])
        second = session.run([sandbox.python, "-I", "-c", "print(open('f').read())"])
        assert first.ok and second.ok
        assert second.stdout == b"kept\n"
        directory = session.directory
    assert not directory.exists()
