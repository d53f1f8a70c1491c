"""A real ``dockyard sandbox serve`` process for the tests (the SWE environment's service);
:func:`sandbox_service` runs any service that prints ``listening on <url>``."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path


def dockyard_command(*args: str) -> list[str]:
    """``dockyard <args>`` as this interpreter runs it, logging JSON."""
    return [sys.executable, "-m", "dockyard", "--log-format", "json", *args]


def serve_command(repos: Path, policy: Path, *extra: str) -> list[str]:
    return dockyard_command(
        "sandbox", "serve", "--port", "0", "--repos", str(repos), "--policy", str(policy), *extra
    )


@contextmanager
def sandbox_service(
    command: Sequence[str], env: Mapping[str, str] | None = None, start_timeout_s: float = 60
) -> Iterator[str]:
    """The service's URL, read from the one line it prints once it listens; killed after."""
    process = subprocess.Popen(
        list(command),
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=start_timeout_s), "sandbox service did not start"
        line = process.stdout.readline()
        assert line.startswith("listening on "), line
        yield line.split()[-1]
    finally:
        process.kill()
        process.wait(timeout=10)
