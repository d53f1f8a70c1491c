"""Helpers for the sandbox tests: processes owned by sandbox uids, a root-only marker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dockyard.config.sections.env import SandboxLimits
from tests.sandbox_ownership import our_live_sandbox_processes


def live_sandbox_processes() -> list[int]:
    """Non-zombie processes owned by any uid of the default sandbox range that this test
    process started or that were orphaned (another xdist worker's runs are not ours)."""
    return our_live_sandbox_processes()


requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="privilege drop and network namespaces need root"
)


def processes_whose_cmdline_contains(marker: bytes) -> list[int]:
    """Pids of every process on the machine (any uid) whose command line contains ``marker``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(os.path.join(entry.path, "cmdline"), "rb") as cmdline:
                    if marker in cmdline.read():
                        found.append(int(entry.name))
            except OSError:
                continue  # exited while we looked
    return found


def describe(pids: list[int]) -> list[str]:
    """``pid: cmdline (parent pid)`` of each process, for a failure message."""
    described = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            cmdline, parent = "(exited)", "?"
        described.append(f"{pid}: {cmdline[:200]} (parent {parent})")
    return described


def _kernel_isolation_problem() -> str | None:
    from dockyard.environments.sandbox import Sandbox, SandboxUnavailableError

    try:
        Sandbox(SandboxLimits())
    except SandboxUnavailableError as error:
        return str(error)
    return None


#: Tests of what the kernel isolates: skipped, with the sandbox's own reason, where it refuses.
requires_kernel_isolation = pytest.mark.skipif(
    (problem := _kernel_isolation_problem()) is not None,
    reason=f"no kernel isolation on this machine: {problem}",
)
