"""A real run with two rollout sites: the trainer (with its dispatcher) at site A, rollout
workers and a scorer at site B and at site C, each site its own nats-server, B and C each a
leaf node of A over its own emulated WAN link (``tests/wan_proxy.py``; issue #24,
``docs/operations.md`` "Multi-site"). The run finishes by itself; both rollout sites contribute
experience; the trainer's ledger shows every group trained once or explicitly dropped; each
weight version crosses each site's link once although B has two workers reading it.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.conftest import fresh_namespace
from tests.integration.broker.test_two_sites import (
    WAN_DELAY_S,
    _free_port,
    start_rollout_site,
    start_site_a,
)
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps
from tests.integration.e2e.test_two_sites_run import _refitted_versions, _role, _stop, run_config
from tests.wan_proxy import WanLinkThread

pytestmark = pytest.mark.slow

STEPS = 4
#: Rollout workers per rollout site: two at B, so a second reader there would show up as a
#: second copy on B's link if workers read through the WAN instead of B's mirror.
WORKERS = {"b": 2, "c": 1}


def _site_streams(url: str, namespace: str, domain: str) -> dict[str, tuple[int, int]]:
    """(messages, bytes) of each stream at one site, read from its server after the run."""
    config = DataPlaneConfig.model_validate(
        {"url": url, "namespace": namespace, "site": {"domain": domain}}
    )

    async def read() -> dict[str, tuple[int, int]]:
        plane = JetStreamPlane(config, provision=False)
        await plane.start()
        try:
            return {s.name: (s.messages, s.bytes) for s in await plane.streams()}
        finally:
            await plane.close()

    return asyncio.run(read())


def test_a_run_with_two_rollout_sites_trains_on_both(
    tmp_path: Path,
    small_run: list[str],
    nats_server_factory: Callable[..., EmbeddedNatsServer],
) -> None:
    namespace = fresh_namespace()
    leaf_port = _free_port()
    hub = start_site_a(nats_server_factory, tmp_path, leaf_port)
    links = {d: WanLinkThread("127.0.0.1", leaf_port, delay_s=WAN_DELAY_S) for d in WORKERS}
    servers = {
        d: start_rollout_site(nats_server_factory, tmp_path, links[d].port, namespace, d)
        for d in WORKERS
    }
    for link in links.values():
        link.wait_connected()
    run_dir, status_dir, logs = tmp_path / "run", tmp_path / "run" / "status", tmp_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    config = run_config(small_run, STEPS, namespace)
    status = ["--status-dir", str(status_dir)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for domain, workers in WORKERS.items():
            site = [
                *config,
                f"data_plane.url={servers[domain].url}",
                f"data_plane.site.domain={domain}",
                "data_plane.site.trainer_domain=a",
                *status,
            ]
            scorer = f"s-{domain}"
            processes.append(_role(["score", *site, "--scorer-id", scorer], logs / f"{scorer}.log"))
            for index in range(workers):
                worker = f"w-{domain}{index}"
                processes.append(
                    _role(["rollout", *site, "--worker-id", worker], logs / f"{worker}.log")
                )
        trainer = _role(
            [
                "trainer",
                *config,
                f"data_plane.url={hub.url}",
                "data_plane.site.domain=a",
                f"data_plane.site.rollout_domains=[{','.join(WORKERS)}]",
                *status,
                "--run-dir",
                str(run_dir),
            ],
            logs / "trainer.log",
        )
        processes.append(trainer)
        trainer.wait(timeout=900)
        assert trainer.returncode == 0, (logs / "trainer.log").read_text()[-4000:]
    finally:
        for process in processes:
            _stop(process)
        for link in links.values():
            link.close()
    assert metric_steps(run_dir)[-1] == STEPS
    trained = assert_exactly_once(run_dir)
    assert len(trained) == STEPS * 4  # grpo.num_prompts_per_step groups each step
    experience = f"{namespace}_experience"
    blobs = f"{namespace}_blobs"
    at = {d: _site_streams(servers[d].url, namespace, d) for d in WORKERS}
    at_a = _site_streams(hub.url, namespace, "a")
    # Both rollout sites stored experience, and A holds what both stored (sourced, once each).
    assert all(at[d][experience][0] > 0 for d in WORKERS), at
    assert at_a[experience][0] == sum(at[d][experience][0] for d in WORKERS)
    for domain, link in links.items():
        mirrored = at[domain][blobs][1]  # every blob that reached the site (a mirror keeps all)
        crossed = link.link.counters.to_downstream
        # Once per site: B's two workers read B's mirror, so B's link carries one copy too.
        assert mirrored <= crossed < 1.5 * mirrored, (domain, crossed, mirrored)
        for index in range(WORKERS[domain]):
            assert _refitted_versions(logs / f"w-{domain}{index}.log")[-1] == STEPS
