"""Two sites joined by a NATS leaf node over an emulated WAN (``tests/wan_proxy.py``).

Site A (the trainer's) and site B (rollout workers, scorers) each run a real nats-server with
its own JetStream domain; B's leaf connection to A goes through a userspace proxy that adds
latency and can cut the link. The claims under test (issue #24, ``docs/operations.md``):

- experience stored at B reaches A's trainer consumer, also what B stored while the link was
  cut, and each message exactly once;
- a weight version put at A crosses the link once, however many B workers read it, and a B
  worker that starts after the partition reads the newest version from B's copy.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import ProvisioningDrift
from dockyard.broker.sites import hub_leafnodes, leaf_remote
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.conftest import fresh_namespace
from tests.integration.broker.broker_test_utils import eventually, fetch_until
from tests.wan_proxy import SiteLink, WanLink

MiB = 1024 * 1024
#: How long the link stays cut. The issue asks for 30 s; the default is shorter because the
#: proxy aborts the TCP connection at once (both servers see the partition immediately, no
#: keep-alive has to expire), so a longer cut exercises the same recovery (a source or mirror
#: resuming from its last sequence) and only costs wall time on a shared machine. Set
#: DOCKYARD_TEST_PARTITION_S=30 to run the issue's length.
PARTITION_S = float(os.environ.get("DOCKYARD_TEST_PARTITION_S", "5"))
#: One-way delay of the emulated WAN link.
WAN_DELAY_S = 0.02


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_site_a(
    factory: Callable[..., EmbeddedNatsServer], store: Path, leaf_port: int
) -> EmbeddedNatsServer:
    """The trainer site's server: JetStream domain ``a``, leaf nodes accepted on
    ``leaf_port`` (where the WAN link forwards to)."""
    return factory(
        store_dir=store / "site-a",
        jetstream_extra={"domain": "a"},
        extra={"server_name": "site_a", "leafnodes": hub_leafnodes(f"127.0.0.1:{leaf_port}")},
    )


def start_rollout_site(
    factory: Callable[..., EmbeddedNatsServer],
    store: Path,
    link_port: int,
    namespace: str,
    domain: str,
) -> EmbeddedNatsServer:
    """A rollout site's server: JetStream domain ``domain``, a leaf of A through the link."""
    return factory(
        store_dir=store / f"site-{domain}",
        jetstream_extra={"domain": domain},
        extra={
            "server_name": f"site_{domain}",
            "leafnodes": leaf_remote(f"nats://127.0.0.1:{link_port}", namespace),
        },
    )


def start_site_b(
    factory: Callable[..., EmbeddedNatsServer], store: Path, link_port: int, namespace: str
) -> EmbeddedNatsServer:
    """The rollout site's server: JetStream domain ``b``, a leaf of A through the link."""
    return start_rollout_site(factory, store, link_port, namespace, "b")


@dataclass
class TwoSites:
    hub: EmbeddedNatsServer
    leaf: EmbeddedNatsServer
    link: SiteLink
    namespace: str
    make_config: Callable[..., DataPlaneConfig]

    @property
    def names(self) -> PlaneNames:
        return PlaneNames(self.namespace)

    def trainer_site(self, **overrides: object) -> DataPlaneConfig:
        return self.make_config(
            self.hub.url,
            namespace=self.namespace,
            site={"domain": "a", "rollout_domains": ["b"]},
            **overrides,
        )

    def rollout_site(self, **overrides: object) -> DataPlaneConfig:
        return self.make_config(
            self.leaf.url,
            namespace=self.namespace,
            site={"domain": "b", "trainer_domain": "a"},
            **overrides,
        )


@pytest.fixture
async def sites(
    nats_server_factory: Callable[..., EmbeddedNatsServer],
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    tmp_path: Path,
) -> AsyncIterator[TwoSites]:
    namespace = fresh_namespace()
    leaf_port = _free_port()
    hub = start_site_a(nats_server_factory, tmp_path, leaf_port)
    link = WanLink("127.0.0.1", leaf_port, delay_s=WAN_DELAY_S)
    await link.start()
    leaf = start_site_b(nats_server_factory, tmp_path, link.port, namespace)
    await link.wait_connected()
    try:
        yield TwoSites(hub, leaf, link, namespace, data_plane_config_factory)
    finally:
        await link.close()


async def _provisioned(config: DataPlaneConfig) -> JetStreamPlane:
    plane = JetStreamPlane(config)
    await plane.start()
    return plane


def _scored(names: PlaneNames, index: int) -> OutgoingMessage:
    return OutgoingMessage(names.scored, f"group-{index}".encode(), msg_id=f"scored-{index}")


@pytest.mark.slow
async def test_experience_stored_at_b_during_a_partition_reaches_a_once(sites: TwoSites) -> None:
    names = sites.names
    # B first: A's experience stream sources B's, which must exist to be read.
    rollout = await _provisioned(sites.rollout_site())
    trainer = await _provisioned(sites.trainer_site())
    try:
        await rollout.publish_many([_scored(names, i) for i in range(10)])
        before = await fetch_until(trainer, names.scored_consumer, 10, timeout_s=60)
        assert [d.msg_id for d in before] == [f"scored-{i}" for i in range(10)]
        for delivery in before:
            await delivery.ack()

        sites.link.cut()
        # B's workers keep going while the WAN is down: their experience is acked by B's own
        # server and waits there (a publish through the link would have failed instead).
        during = await rollout.publish_many([_scored(names, i) for i in range(10, 30)])
        assert all(ack.stream == names.experience_stream.name for ack in during)
        # The trainer gets nothing new while the link is cut (it trains on what it has).
        assert await trainer.fetch(names.scored_consumer, batch=30, timeout_s=PARTITION_S) == []
        sites.link.heal()

        await rollout.publish_many([_scored(names, i) for i in range(30, 40)])
        after = await fetch_until(trainer, names.scored_consumer, 30, timeout_s=120)
        for delivery in after:
            await delivery.ack()
        # Everything stored at B arrived, in B's order, and nothing twice: the source resumed
        # from the last sequence it had copied.
        assert [d.msg_id for d in after] == [f"scored-{i}" for i in range(10, 40)]
        assert await trainer.fetch(names.scored_consumer, batch=10, timeout_s=1.0) == []
        state = {s.name: s for s in await trainer.streams()}[names.experience_stream.name]
        assert state.messages == 40
    finally:
        await trainer.close()
        await rollout.close()


@pytest.mark.slow
async def test_prompts_published_at_a_reach_the_workers_at_b_once_across_a_partition(
    sites: TwoSites,
) -> None:
    names = sites.names
    rollout = await _provisioned(sites.rollout_site())
    trainer = await _provisioned(sites.trainer_site())

    def prompt(index: int) -> OutgoingMessage:
        return OutgoingMessage(names.prompts, f"prompt-{index}".encode(), msg_id=f"p-{index}")

    try:
        await trainer.publish_many([prompt(i) for i in range(10)])
        first = await fetch_until(rollout, names.prompt_consumer, 10, timeout_s=60)
        sites.link.cut()
        # The dispatcher at A keeps filling its queue while B is cut off; B's workers drain
        # what already crossed.
        await trainer.publish_many([prompt(i) for i in range(10, 20)])
        for delivery in first:
            await delivery.ack()
        assert await rollout.fetch(names.prompt_consumer, batch=10, timeout_s=PARTITION_S) == []
        sites.link.heal()
        rest = await fetch_until(rollout, names.prompt_consumer, 10, timeout_s=120)
        for delivery in rest:
            await delivery.ack()
        got = [d.msg_id for d in (*first, *rest)]
        assert got == [f"p-{i}" for i in range(20)]
        assert await rollout.fetch(names.prompt_consumer, batch=10, timeout_s=1.0) == []
        # The trainer's queue lets go of a group only once B stored it (flow-control acks).
        await eventually(
            lambda: _stream_messages(trainer, names.prompts_stream.name, 0),
            timeout_s=60,
            what="A's prompt queue emptied by B's acks",
        )
    finally:
        await trainer.close()
        await rollout.close()


async def _stream_messages(plane: JetStreamPlane, stream: str, wanted: int) -> bool:
    state = {s.name: s for s in await plane.streams()}[stream]
    return state.messages == wanted


async def test_a_weight_version_crosses_the_link_once_for_every_worker_at_b(
    sites: TwoSites,
) -> None:
    names = sites.names
    transport = {"chunk_size": MiB}
    rollout = await _provisioned(sites.rollout_site(weight_transport=transport))
    trainer = await _provisioned(sites.trainer_site(weight_transport=transport))
    workers = [await _provisioned(sites.rollout_site(weight_transport=transport)) for _ in range(3)]
    late: JetStreamPlane | None = None
    try:
        store = create_weight_store(trainer, reader_id="trainer")
        blob = torch.randint(0, 256, (4 * MiB,), dtype=torch.uint8).numpy().tobytes()
        start = sites.link.counters.to_downstream
        ref = await store.put(1, blob)
        await trainer.publish(names.weight_events, ref.uri.encode(), msg_id="weights-1")

        async def read(plane: JetStreamPlane, reader: str) -> bytes:
            event = await eventually(plane.current_weight_event, timeout_s=60, what="v1 at B")
            assert event is not None and event.data == ref.uri.encode()
            return await create_weight_store(plane, reader_id=reader).get_bytes(ref)

        got = await asyncio.gather(*(read(w, f"worker-{i}") for i, w in enumerate(workers)))
        assert all(copy == blob for copy in got)
        crossed = sites.link.counters.to_downstream - start
        # Once, not once per worker: three workers reading through the link would move 3x.
        assert len(blob) <= crossed < 2 * len(blob)

        # A version published while the link is cut reaches B after it heals, and a worker
        # that starts only then reads the newest version from B's mirror.
        sites.link.cut()
        newer = torch.randint(0, 256, (2 * MiB,), dtype=torch.uint8).numpy().tobytes()
        ref2 = await store.put(2, newer)
        await trainer.publish(names.weight_events, ref2.uri.encode(), msg_id="weights-2")
        sites.link.heal()
        late = await _provisioned(sites.rollout_site(weight_transport=transport))

        async def newest() -> bool:
            event = await late.current_weight_event()
            return event is not None and event.data == ref2.uri.encode()

        await eventually(newest, timeout_s=120, what="v2 at B after the partition")
        assert await create_weight_store(late, reader_id="late").get_bytes(ref2) == newer
    finally:
        for plane in (*workers, trainer, rollout, *([late] if late else [])):
            await plane.close()


async def test_a_plane_refuses_a_server_of_another_domain(sites: TwoSites) -> None:
    # Pointed at A's server but configured as site B: its weight streams would mirror itself.
    config = sites.make_config(
        sites.hub.url, namespace=sites.namespace, site={"domain": "b", "trainer_domain": "a"}
    )
    plane = JetStreamPlane(config)
    with pytest.raises(ProvisioningDrift, match=r"data_plane\.site\.domain is 'b'.*'a'"):
        await plane.start()
    await plane.close()
