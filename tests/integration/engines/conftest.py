"""Integration fixtures for engines: the unit tests' independent reference maths."""

from __future__ import annotations

import sys
from pathlib import Path

# One implementation of the reference log-probs, shared with tests/unit/engines.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "engines"))


from tests.vllm_install import ensure_vllm

ensure_vllm()
