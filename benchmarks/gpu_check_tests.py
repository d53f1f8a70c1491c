"""GPU check, measurement 5: the trainer's packing, precision and loss-equality tests.

The trainer tests pick cuda:0 when torch sees a GPU (tests/unit/trainer/test_precision.py's
DEVICE, PolicyTrainer's training_device), so on a GPU they check there that packed and dynamic
micro-batches give the padded loss and gradients, float32 master weights, bf16/fp16 autocast
and fp16 loss scaling. The loss tests build their tensors on the CPU: on a GPU machine they
check the same loss code, not CUDA kernels (said in the report).

Run with ``--noconftest`` and no addopts: the suite's conftest installs Debian packages when
some are missing (apt, which a machine with no network would wait on) and its addopts need
pytest-xdist; these tests use neither. The dry run only collects them (the CPU suite runs them
in full: 78 tests, ≈ 3 minutes on 2 cores, too long for a dry run).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from gpu_check_common import write_row

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/unit/trainer/test_packing.py",
    "tests/unit/trainer/test_precision.py",
    "tests/unit/algorithms/test_loss_branches.py",
    "tests/unit/algorithms/test_loss_properties.py",
]


def counts(summary: str) -> dict[str, int]:
    """``{"passed": 78, "failed": 1, ...}`` from pytest's last summary line."""
    return {
        word: int(n)
        for n, word in re.findall(
            r"(\d+) (passed|failed|error|errors|skipped|tests? collected)", summary
        )
    }


def run(results: Path, dry_run: bool) -> None:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-o",
        "addopts=",
        *(["--collect-only"] if dry_run else []),
        *TESTS,
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (results / "tests.log").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    found = counts(last)
    write_row(
        results,
        "tests",
        mode="collected only (dry run)" if dry_run else "run",
        files=TESTS,
        returncode=done.returncode,
        summary=last,
        counts=found,
        seconds=seconds,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pytest exited {done.returncode}: {last}")
