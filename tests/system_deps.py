"""System packages the test run installs (the test setup CI runs), like ``tests/vllm_install.py``.

``scripts/ensure_system_packages.sh`` installs bubblewrap, which the sandbox needs for kernel
isolation, and pytest for the sandbox's interpreter; it is a no-op when both are there. Where it
cannot install (no root or apt) it says so, and every sandboxed run is then refused with that
reason (the sandbox never runs weaker silently).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def ensure_system_packages() -> None:
    subprocess.run(["bash", str(SCRIPTS / "ensure_system_packages.sh")], check=False)
