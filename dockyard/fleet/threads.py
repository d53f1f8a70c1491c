"""Compute threads per role when the roles of one run share a machine's cores.

``dockyard run`` starts the trainer (one process per rank), the rollout workers and the scorers
on one machine, and each would size torch's (OpenMP/MKL) thread pool to every core. Pools that
together ask for more threads than there are cores spin-wait on each other: on a loaded
2-core machine a trainer step took 40.7 s with two threads against 2.3 s with one, and 1 in 5
whole runs was 8.5x slower a step (docs/benchmarks.md, "Threads per role"). So each role gets
``cores // roles`` threads, at least one. A user's own ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` is never overridden.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: The variables torch's CPU thread pools read at start-up.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def available_cpus() -> int:
    """The cores this process may run on (a cgroup/taskset limit counts, unlike cpu_count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_role(cpus: int, roles: int) -> int:
    """An equal share of ``cpus`` for each of ``roles`` compute roles, at least one thread."""
    if cpus < 1 or roles < 1:
        raise ValueError(f"threads_per_role needs cpus >= 1 and roles >= 1, got {cpus}, {roles}")
    return max(1, cpus // roles)


def role_thread_env(environ: Mapping[str, str], roles: int, cpus: int) -> dict[str, str]:
    """The thread variables to give each role process: every one the user has not set."""
    share = str(threads_per_role(cpus, roles))
    return {name: share for name in THREAD_VARIABLES if name not in environ}
