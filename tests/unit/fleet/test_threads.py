"""Compute threads per role when ``dockyard run`` starts several roles on one machine.

The rule (docs/configuration.md, "Threads per role"): each role process gets an equal share of
the cores, ``cores // roles``, at least one; a user's own ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` is left as set.
"""

from __future__ import annotations

import os

import pytest

from dockyard.fleet.supervisor import Supervisor
from dockyard.fleet.threads import role_thread_env, threads_per_role


@pytest.mark.parametrize(
    ("cpus", "roles", "expected"),
    [
        (2, 3, 1),  # the quickstart on 2 cores: fewer cores than roles, still one thread each
        (16, 3, 5),  # 16 // 3, the one spare core left to the OS and the broker
        (8, 2, 4),
        (4, 4, 1),
        (1, 1, 1),
    ],
)
def test_each_role_gets_an_equal_share_of_the_cores(cpus, roles, expected):
    assert threads_per_role(cpus, roles) == expected


@pytest.mark.parametrize(("cpus", "roles"), [(0, 3), (4, 0)])
def test_no_cores_or_no_roles_is_refused(cpus, roles):
    with pytest.raises(ValueError, match="cpus >= 1 and roles >= 1"):
        threads_per_role(cpus, roles)


def test_a_users_own_thread_setting_is_kept_and_only_the_unset_variable_is_given():
    env = role_thread_env({"OMP_NUM_THREADS": "7"}, roles=3, cpus=12)
    assert env == {"MKL_NUM_THREADS": "4"}


def _supervisor(tmp_path, **counts) -> Supervisor:
    return Supervisor(tmp_path / "missing.yaml", [], tmp_path / "run", **counts)


def test_the_supervisor_divides_the_machines_cores_among_the_roles_it_starts(tmp_path, monkeypatch):
    # This machine has 2 cores; the rule's interesting case needs more, so the process's CPU
    # set is what changes (it is what a taskset or cgroup limit changes too).
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    # Trainer + 2 rollout workers + 1 scorer: 4 roles, 8 // 4 = 2 threads each.
    env = _supervisor(tmp_path, num_rollout_workers=2, num_scorers=1).env
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("2", "2")
    # Two trainer ranks are two processes: 5 roles, 8 // 5 = 1.
    env = _supervisor(tmp_path, num_rollout_workers=2, num_scorers=1, trainer_ranks=2).env
    assert env["OMP_NUM_THREADS"] == "1"


def test_the_supervisor_keeps_a_users_omp_num_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = _supervisor(tmp_path, num_rollout_workers=1, num_scorers=1).env
    assert env["OMP_NUM_THREADS"] == "3"
