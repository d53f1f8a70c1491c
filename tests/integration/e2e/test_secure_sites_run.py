"""A real run across two sites started with ``dockyard broker up --secure`` (issue #24,
``docs/operations.md``, "Credentials across sites"): site A's server accepts B's leaf connection
only with the leaf user it wrote; each role runs with its own site's role credential (the
trainer, hosting the dispatcher, at A; a rollout worker and a scorer at B). The run finishes by
itself and the ledger shows every group trained once or explicitly dropped.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import fresh_namespace
from tests.integration.broker.test_broker_cli import _start_broker_up, _wait_for_url
from tests.integration.broker.test_broker_cli import _stop as _stop_broker
from tests.integration.broker.test_secure_sites import SITE_A, SITE_B
from tests.integration.broker.test_two_sites import _free_port
from tests.integration.e2e.conftest import QUICKSTART
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps
from tests.integration.e2e.test_two_sites_run import _role, _stop, run_config

pytestmark = pytest.mark.slow

STEPS = 4


def _role_file(store: Path, role: str, out: Path) -> Path:
    """The quickstart with the role's credential (written by ``broker up --secure``): a 0600
    file, since a password on the command line is refused (every local user can read argv)."""
    credential = yaml.safe_load((store / "credentials" / f"{role}.yaml").read_text())
    out.touch(mode=0o600)
    out.write_text(yaml.safe_dump({"defaults": [str(QUICKSTART)], **credential}))
    return out


def test_a_secured_run_across_two_sites(tmp_path: Path, small_run: list[str]) -> None:
    namespace = fresh_namespace()
    leaf_port = _free_port()
    ns = f"data_plane.namespace={namespace}"
    broker = ["--secure", "--port", "-1", "--config", str(QUICKSTART)]
    store_a, store_b = tmp_path / "a", tmp_path / "b"
    brokers = [
        _start_broker_up(
            *broker, "--store", str(store_a), "--leafnodes", f"127.0.0.1:{leaf_port}", ns, *SITE_A
        )
    ]
    processes: list[subprocess.Popen[bytes]] = []
    run_dir, status_dir, logs = tmp_path / "run", tmp_path / "run" / "status", tmp_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        url_a = _wait_for_url(brokers[0])
        brokers.append(
            _start_broker_up(
                *broker,
                "--store",
                str(store_b),
                "--hub",
                f"nats-leaf://127.0.0.1:{leaf_port}",
                "--leaf-credentials",
                str(store_a / "credentials" / "leaf-b.yaml"),
                ns,
                *SITE_B,
            )
        )
        url_b = _wait_for_url(brokers[1])
        # Every role's config is the quickstart (as broker up provisioned it) with its credential.
        common = run_config(small_run, STEPS, namespace)[2:]  # without the --config pair
        status = ["--status-dir", str(status_dir)]

        def role(name: str, store: Path, url: str, site: list[str]) -> list[str]:
            config = _role_file(store, name, tmp_path / f"{name}.yaml")
            return ["--config", str(config), *common, f"data_plane.url={url}", *site, *status]

        processes.append(
            _role(
                ["score", *role("scorer", store_b, url_b, SITE_B), "--scorer-id", "s0"],
                logs / "s0.log",
            )
        )
        processes.append(
            _role(
                ["rollout", *role("rollout", store_b, url_b, SITE_B), "--worker-id", "w0"],
                logs / "w0.log",
            )
        )
        trainer = _role(
            ["trainer", *role("trainer", store_a, url_a, SITE_A), "--run-dir", str(run_dir)],
            logs / "trainer.log",
        )
        processes.append(trainer)
        trainer.wait(timeout=900)
        assert trainer.returncode == 0, (logs / "trainer.log").read_text()[-4000:]
    finally:
        for role_process in processes:
            _stop(role_process)
        for broker_process in brokers:
            _stop_broker(broker_process)
    assert metric_steps(run_dir)[-1] == STEPS
    assert len(assert_exactly_once(run_dir)) == STEPS * 4  # grpo.num_prompts_per_step a step
