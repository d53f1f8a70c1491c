"""Helpers for end-to-end runs: the real `dockyard run` in a subprocess, small and fast."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dockyard.observability.status_files import read_statuses
from tests.osworld_simulator import simulator_command
from tests.sandbox_service import sandbox_service, serve_command

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"

# A few steps of the quickstart: no SFT, small validation, frequent checkpoints.
SMALL_RUN = [
    "sft.enabled=false",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=8",
    "grpo.max_val_samples=16",
    "grpo.val_period=2",
    "checkpointing.save_period=2",
    "checkpointing.keep_top_k=null",
    "run.starvation_warning_s=20",
    "run.starvation_timeout_s=120",
]


def run_dockyard(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dockyard", "--log-format", "json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def start_dockyard(*args: str) -> subprocess.Popen[str]:
    """A ``dockyard`` command in the background (stdout and stderr piped): end it with
    :func:`stop`."""
    return subprocess.Popen(
        [sys.executable, "-m", "dockyard", "--log-format", "json", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(process: subprocess.Popen[str], timeout_s: float = 120) -> tuple[str, str]:
    """SIGTERM (a graceful stop), then SIGKILL if it is not gone within ``timeout_s``; what it
    printed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()


def trainer_step(status_dir: Path) -> int:
    """The step the trainer last reported in its status file (0 before it has one)."""
    for status in read_statuses(status_dir) if status_dir.exists() else []:
        if status.role == "trainer":
            return int(status.counters.get("step", 0))
    return 0


def wait_until(predicate, timeout_s: float, what: str) -> None:
    """Poll a run's own records (status files) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def small_run():
    return list(SMALL_RUN)


@pytest.fixture(scope="module")
def sandbox_url() -> Iterator[str]:
    """``dockyard sandbox serve`` on the SWE preset's shipped repository and policy (loopback)."""
    data = ROOT / "configs" / "cpu" / "data"
    command = serve_command(data / "swe_repos", data / "swe_policy.yaml")
    with sandbox_service(command) as url:
        yield url


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    """``dockyard osworld serve``: the desktop simulator, a real process (loopback)."""
    with sandbox_service(simulator_command()) as url:
        yield url
