"""Which sandboxed processes belong to this test process: the leak checks' notion of "ours".

Sandboxed runs are owned by uids of one range on the whole machine. With the suite on several
pytest-xdist workers, another worker's run is alive while this worker's test ends, and is no
leak of this test. A process is ours when this process is among its ancestors, or when it was
orphaned (re-parented to init): an escaped daemon is exactly the leak the checks exist for.
"""

from __future__ import annotations

import os

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.sandbox.identity import live_processes_in_uid_range, sandbox_uid_range


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name may hold spaces or parentheses: fields follow the last ')'.
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None  # exited while we looked


def is_ours(pid: int, root: int | None = None) -> bool:
    root = os.getpid() if root is None else root
    parent = _parent_of(pid)
    if parent is not None and parent <= 1:
        return True
    while parent is not None and parent > 1:
        if parent == root:
            return True
        parent = _parent_of(parent)
    return False


def our_live_sandbox_processes() -> list[int]:
    """Non-zombie processes of the default sandbox uid range that are ours (see above)."""
    return [
        pid
        for pid in live_processes_in_uid_range(sandbox_uid_range(SandboxLimits()))
        if is_ours(pid)
    ]
