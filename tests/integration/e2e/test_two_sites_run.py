"""A real run across two sites: the trainer (with its dispatcher) at site A, a rollout worker
and a scorer at site B, each site its own nats-server, B a leaf node of A over an emulated WAN
link (``tests/wan_proxy.py``) that is cut mid-run and healed (issue #24, ``docs/operations.md``,
"Two sites"). The run finishes by itself; the trainer's ledger shows every group trained once
or explicitly dropped; staleness stays within ``grpo.async_grpo.max_trajectory_age_steps``; a
worker that joins at B after the partition receives the current weights and generates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dockyard.config.loader import load_config
from tests.conftest import fresh_namespace
from tests.integration.broker.test_two_sites import (
    PARTITION_S,
    WAN_DELAY_S,
    _free_port,
    start_site_a,
    start_site_b,
)
from tests.integration.e2e.conftest import QUICKSTART, ROOT, trainer_step, wait_until
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps
from tests.wan_proxy import WanLinkThread

pytestmark = pytest.mark.slow

STEPS = 8
CUT_AT_STEP = 2
#: The age limit the run is held to: the quickstart's own (the run uses its config).
MAX_AGE_STEPS = load_config(QUICKSTART).grpo.async_grpo.max_trajectory_age_steps


def _role(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **os.environ}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "dockyard", "--log-format", "json", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_config(small_run: list[str], steps: int, namespace: str) -> list[str]:
    """The quickstart, small, for ``steps`` steps in ``namespace`` (every role's arguments)."""
    return [
        "--config",
        str(QUICKSTART),
        *small_run,
        f"grpo.max_num_steps={steps}",
        f"data_plane.namespace={namespace}",
    ]


def test_a_run_across_two_sites_rides_out_a_partition(
    tmp_path, small_run, nats_server_factory
) -> None:
    namespace = fresh_namespace()
    leaf_port = _free_port()
    hub = start_site_a(nats_server_factory, tmp_path, leaf_port)
    link = WanLinkThread("127.0.0.1", leaf_port, delay_s=WAN_DELAY_S)
    leaf = start_site_b(nats_server_factory, tmp_path, link.port, namespace)
    link.wait_connected()
    run_dir, status_dir, logs = tmp_path / "run", tmp_path / "run" / "status", tmp_path / "logs"
    logs = Path(os.environ.get("DOCKYARD_TEST_ROLE_LOGS", logs))  # kept for a failed run
    logs.mkdir(parents=True, exist_ok=True)
    config = run_config(small_run, STEPS, namespace)
    status = ["--status-dir", str(status_dir)]
    site_a = [*config, f"data_plane.url={hub.url}", "data_plane.site.domain=a"]
    site_b = [
        *config,
        f"data_plane.url={leaf.url}",
        "data_plane.site.domain=b",
        "data_plane.site.trainer_domain=a",
        *status,
    ]
    processes = []
    try:
        processes.append(_role(["score", *site_b, "--scorer-id", "s0"], logs / "s0.log"))
        processes.append(_role(["rollout", *site_b, "--worker-id", "w0"], logs / "w0.log"))
        trainer = _role(
            [
                "trainer",
                *site_a,
                "data_plane.site.rollout_domains=[b]",
                *status,
                "--run-dir",
                str(run_dir),
            ],
            logs / "trainer.log",
        )
        processes.append(trainer)
        wait_until(lambda: trainer_step(status_dir) >= CUT_AT_STEP, 240, f"step {CUT_AT_STEP}")
        link.cut()
        time.sleep(PARTITION_S)  # the partition itself, not synchronisation
        # Mid-run: the trainer cannot finish while its rollout site is cut off.
        assert trainer_step(status_dir) < STEPS
        link.heal()
        late = _role(["rollout", *site_b, "--worker-id", "w-late"], logs / "late.log")
        processes.append(late)
        trainer.wait(timeout=600)
        assert trainer.returncode == 0, (logs / "trainer.log").read_text()[-4000:]
        # The late worker may still be loading its engine when the trainer is done (w0 did the
        # work): whenever it starts, it must reach the last version from B's mirror.
        wait_until(
            lambda: _last_refit(logs / "late.log") == STEPS, 180, f"the late worker on v{STEPS}"
        )
    finally:
        for process in processes:
            _stop(process)
        link.close()
    assert metric_steps(run_dir)[-1] == STEPS
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * 4  # grpo.num_prompts_per_step groups each step
    ages = [
        json.loads(line)["metrics"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    worst = max(m[k] for m in ages for k in m if k.endswith("staleness/max"))
    assert worst <= MAX_AGE_STEPS
    # Both workers at B end on the last version the trainer published (version k after step
    # k), the late one included: it read the current weights from B's mirror when it started.
    assert _refitted_versions(logs / "w0.log")[-1] == STEPS
    assert _refitted_versions(logs / "late.log")[-1] == STEPS


def _last_refit(log: Path) -> int | None:
    """The newest version a running worker has loaded so far (its log may end mid-line)."""
    try:
        versions = _refitted_versions(log)
    except (OSError, ValueError):
        return None
    return versions[-1] if versions else None


def _refitted_versions(log: Path) -> list[int]:
    """The versions a rollout worker loaded, from its own JSON log (``refit.done``)."""
    versions = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "refit.done":
                versions.append(int(record["version"]))
    return versions
