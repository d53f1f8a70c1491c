"""System packages the test run installs (the test setup CI runs), like ``tests/vllm_install.py``.

``scripts/ensure_bwrap.sh`` installs bubblewrap, which the sandbox needs for kernel isolation; it
is a no-op when ``bwrap`` is on PATH. Where it cannot install (no root or apt) it says so, and
every sandboxed run is then refused with that reason (the sandbox never runs weaker silently).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def ensure_bwrap() -> None:
    if shutil.which("bwrap") is None:
        subprocess.run(["bash", str(SCRIPTS / "ensure_bwrap.sh")], check=False)
