"""Teacher engine servers as child processes: ``dockyard model serve`` for one model, its URL
read from the one line it prints on stdout once its socket listens (no polling, no port picked
in advance), stopped (terminate, then kill) when the block ends."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dockyard.utils.logging import get_logger

log = get_logger(__name__)

STOP_TIMEOUT_S = 30.0


class TeacherServerError(RuntimeError):
    """A teacher server that exited before it listened (its log's tail in the message)."""


@dataclass(frozen=True)
class TeacherServer:
    model: str
    url: str
    log_path: Path


@contextmanager
def teacher_server(
    model: str | Path, precision: str, log_path: Path, *, batch_size: int = 8
) -> Iterator[TeacherServer]:
    """A server answering ``prompt_logprobs`` for ``model`` (served under that name) while the
    block runs; its stderr goes to ``log_path``."""
    command = [
        sys.executable,
        "-m",
        "dockyard",
        "model",
        "serve",
        "--model",
        str(model),
        "--precision",
        precision,
        "--batch-size",
        str(batch_size),
        "--port",
        "0",
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file)
    try:
        assert process.stdout is not None
        # Blocks until the server prints its URL, or returns b"" when it exits first.
        url = process.stdout.readline().decode().strip()
        if not url.startswith("http://"):
            process.wait(timeout=STOP_TIMEOUT_S)
            raise TeacherServerError(
                f"the teacher server for {model} exited with status {process.returncode} "
                f"before listening; {log_path}: {log_path.read_text()[-2000:]}"
            )
        log.info("teacher_server.started", model=str(model), url=url, pid=process.pid)
        yield TeacherServer(model=str(model), url=url, log_path=log_path)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
    if process.stdout is not None:
        process.stdout.close()
