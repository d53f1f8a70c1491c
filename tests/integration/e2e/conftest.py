"""Helpers for end-to-end runs: the real `dockyard run` in a subprocess, small and fast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture
def small_run():
    return list(SMALL_RUN)
