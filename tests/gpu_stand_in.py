"""A stand-in ``nvidia-smi`` for machines without an NVIDIA GPU (like this one and CI).

It answers the one query the GPU monitor makes, the way the real tool does (comma-separated
values in the order asked for, ``[N/A]`` for what a GPU does not report; ``--id=2,3`` limits it
to those indices), after checking it was asked exactly that; anything else exits with status 6,
as the real tool does for a bad query.
The readings are made up: utilization 10·i + 5 % for GPU i, plus the number of earlier calls,
so that successive readings differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPT = """#!{python}
import sys
from pathlib import Path

FIELDS = {fields!r}
args = sys.argv[1:]
ids = None
if args and args[0].startswith("--id="):
    ids = [int(i) for i in args.pop(0)[len("--id="):].split(",")]
if {fail!r} or args != ["--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader,nounits"]:
    print("Invalid combination of input arguments.", file=sys.stderr)
    sys.exit(6)
calls = Path({calls!r})
count = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(count + 1))
for gpu in range({gpus}) if ids is None else ids:
    power = "[N/A]" if gpu == 1 else "{{:.2f}}".format(70 + gpu)
    used = 1000 * (gpu + 1)
    print(f"{{gpu}}, {{10 * gpu + 5 + count}}, {{used}}, 81559, {{40 + gpu}}, {{power}}")
"""


def install_nvidia_smi(directory: Path, *, gpus: int = 2, fail: bool = False) -> Path:
    """Write the stand-in as ``directory/nvidia-smi`` (put ``directory`` first on PATH)."""
    from dockyard.observability.metrics.gpu_monitor import QUERY_FIELDS

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-smi"
    path.write_text(
        _SCRIPT.format(
            python=sys.executable,
            fields=QUERY_FIELDS,
            fail=fail,
            calls=str(directory / "calls"),
            gpus=gpus,
        )
    )
    path.chmod(0o755)
    return path
