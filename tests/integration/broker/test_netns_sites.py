"""Two sites in two network namespaces, joined by a kernel link capped with ``tc tbf`` (#24).

``test_two_sites.py`` runs its claims over a userspace proxy; here the same tests run with
site A's nats-server (the trainer's, JetStream domain ``a``) in namespace A and site B's (a leaf
of A, domain ``b``) in namespace B, so the leaf connection crosses a veth pair whose both ends
are shaped by ``tc qdisc ... tbf`` at :data:`RATE_MBIT`, and a partition is the veth going down
(``ip link set ... down``), then up. Unlike the proxy's cut, which aborts the TCP connection, a
downed link leaves it open: the servers see silence, and TCP retransmits once it heals — the
other way a WAN drops. The claims are the same: experience stored at B reaches A exactly once,
also what B stored during the partition; a weight version crosses once for every worker at B.

The test process (the sites' clients) stays in the root namespace and reaches each server's
client port over that site's own uncapped access veth (``tests/netns_link.py``); the servers
reach each other only over the capped WAN veth.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.conftest import fresh_namespace
from tests.integration.broker.test_two_sites import (
    TwoSites,
    test_a_weight_version_crosses_the_link_once_for_every_worker_at_b,
    test_experience_stored_at_b_during_a_partition_reaches_a_once,
    test_prompts_published_at_a_reach_the_workers_at_b_once_across_a_partition,
)
from tests.netns_link import NetnsSites, leaf_connected, require_netns

#: The WAN's bandwidth each way.
RATE_MBIT = 50

__all__ = [  # the claims of test_two_sites.py, collected here to run over the kernel link
    "test_a_weight_version_crosses_the_link_once_for_every_worker_at_b",
    "test_experience_stored_at_b_during_a_partition_reaches_a_once",
    "test_prompts_published_at_a_reach_the_workers_at_b_once_across_a_partition",
]


@pytest.fixture
def netns_sites() -> Iterator[NetnsSites]:
    require_netns()
    with NetnsSites(rate_mbit=RATE_MBIT) as link:
        yield link


@pytest.fixture
async def sites(
    netns_sites: NetnsSites,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    tmp_path: Path,
) -> AsyncIterator[TwoSites]:
    link = netns_sites
    namespace = fresh_namespace()
    # Both ends of the WAN veth carry the cap (each shapes what it sends).
    for ns, dev in ((link.a, link.wan_a), (link.b, link.wan_b)):
        shaping = link.qdisc(ns, dev)
        assert (shaping.kind, shaping.rate_bytes_per_s) == ("tbf", RATE_MBIT * 1_000_000 // 8)
    hub = link.start_site("a", tmp_path / "site-a", namespace)
    link.start_site("b", tmp_path / "site-b", namespace)
    await leaf_connected(hub)
    yield TwoSites(hub, link.servers[1], link, namespace, data_plane_config_factory)
    # The servers die with the namespaces (netns_sites' teardown).


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def test_a_link_that_fails_half_way_removes_what_it_made_and_nothing_else() -> None:
    require_netns()
    with NetnsSites(rate_mbit=RATE_MBIT) as first:
        # Same names: the second cannot add namespace A; it must say so and leave the first's.
        second = NetnsSites(rate_mbit=RATE_MBIT, tag=first.tag)
        with pytest.raises(RuntimeError, match=rf"ip netns add {first.a} failed"):
            second.open()
        assert {first.a, first.b} <= _namespaces()
        server = first.popen(first.a, ["sleep", "600"])
    assert server.poll() is not None  # killed with its namespace
    assert not {first.a, first.b} & _namespaces()
