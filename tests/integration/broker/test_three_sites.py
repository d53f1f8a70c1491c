"""One trainer site and two rollout sites: A, B and C, three real nats-servers, B and C each a
leaf node of A over its own emulated WAN link (``tests/wan_proxy.py``). The claims under test
(issue #24, ``docs/operations.md`` "Multi-site"):

- every prompt group published at A goes to exactly one of B and C, both get groups, and a group
  routed to a site that is cut off waits at A and arrives once the link heals;
- experience stored at B and at C reaches A's trainer consumer, each message once;
- a weight version put at A crosses each site's link once, however many workers read it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import Delivery
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.conftest import fresh_namespace
from tests.integration.broker.broker_test_utils import eventually, fetch_until
from tests.integration.broker.test_two_sites import (
    PARTITION_S,
    WAN_DELAY_S,
    _free_port,
    _stream_messages,
    start_rollout_site,
    start_site_a,
)
from tests.wan_proxy import WanLink

MiB = 1024 * 1024
ROLLOUT_DOMAINS = ("b", "c")


@dataclass
class ThreeSites:
    hub: EmbeddedNatsServer
    rollout_servers: dict[str, EmbeddedNatsServer]
    links: dict[str, WanLink]
    namespace: str
    make_config: Callable[..., DataPlaneConfig]

    @property
    def names(self) -> PlaneNames:
        return PlaneNames(self.namespace)

    async def trainer_site(self, **overrides: object) -> JetStreamPlane:
        site = {"domain": "a", "rollout_domains": list(ROLLOUT_DOMAINS)}
        return await _provisioned(
            self.make_config(self.hub.url, namespace=self.namespace, site=site, **overrides)
        )

    async def rollout_site(self, domain: str, **overrides: object) -> JetStreamPlane:
        return await _provisioned(
            self.make_config(
                self.rollout_servers[domain].url,
                namespace=self.namespace,
                site={"domain": domain, "trainer_domain": "a"},
                **overrides,
            )
        )


async def _provisioned(config: DataPlaneConfig) -> JetStreamPlane:
    plane = JetStreamPlane(config)
    await plane.start()
    return plane


@pytest.fixture
async def sites(
    nats_server_factory: Callable[..., EmbeddedNatsServer],
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    tmp_path: Path,
) -> AsyncIterator[ThreeSites]:
    namespace = fresh_namespace()
    leaf_port = _free_port()
    hub = start_site_a(nats_server_factory, tmp_path, leaf_port)
    links: dict[str, WanLink] = {}
    servers: dict[str, EmbeddedNatsServer] = {}
    try:
        for domain in ROLLOUT_DOMAINS:
            links[domain] = WanLink("127.0.0.1", leaf_port, delay_s=WAN_DELAY_S)
            await links[domain].start()
            servers[domain] = start_rollout_site(
                nats_server_factory, tmp_path, links[domain].port, namespace, domain
            )
            await links[domain].wait_connected()
        yield ThreeSites(hub, servers, links, namespace, data_plane_config_factory)
    finally:
        for link in links.values():
            await link.close()


def _prompt(names: PlaneNames, index: int) -> OutgoingMessage:
    return OutgoingMessage(names.prompts, f"prompt-{index}".encode(), msg_id=f"p-{index}")


async def _drain(plane: JetStreamPlane, names: PlaneNames, seen: list[str]) -> None:
    """Everything the site's workers can pull now (acked), into ``seen``."""
    while deliveries := await plane.fetch(names.prompt_consumer, batch=50, timeout_s=1.0):
        seen.extend(str(d.msg_id) for d in deliveries)
        await asyncio.gather(*(d.ack() for d in deliveries))


@pytest.mark.slow
async def test_each_prompt_group_goes_to_one_rollout_site_also_across_a_partition(
    sites: ThreeSites,
) -> None:
    names = sites.names
    rollout = {d: await sites.rollout_site(d) for d in ROLLOUT_DOMAINS}
    trainer = await sites.trainer_site()
    seen: dict[str, list[str]] = {d: [] for d in ROLLOUT_DOMAINS}
    try:
        # A batch (the dispatcher's usual publish) and single publishes.
        await trainer.publish_many([_prompt(names, i) for i in range(10)])
        for i in range(10, 20):
            await trainer.publish(names.prompts, f"prompt-{i}".encode(), msg_id=f"p-{i}")

        async def all_arrived() -> bool:
            for domain, plane in rollout.items():
                await _drain(plane, names, seen[domain])
            return sum(len(s) for s in seen.values()) >= 20

        await eventually(all_arrived, timeout_s=120, what="20 prompt groups at B and C")
        assert all(seen[d] for d in ROLLOUT_DOMAINS), seen  # both sites got work

        # C is cut off: what is routed to it waits at A; nothing is lost or given twice.
        sites.links["c"].cut()
        await trainer.publish_many([_prompt(names, i) for i in range(20, 30)])
        for i in range(30, 40):
            await trainer.publish(names.prompts, f"prompt-{i}".encode(), msg_id=f"p-{i}")
        await _drain(rollout["b"], names, seen["b"])
        cut_off = rollout["c"]
        assert await cut_off.fetch(names.prompt_consumer, batch=10, timeout_s=PARTITION_S) == []
        before_heal = len(seen["c"])
        sites.links["c"].heal()
        await eventually(all_arrived, timeout_s=120, what="40 prompt groups after the heal")
        # The batch published just after the cut was split while C's feed was still empty, so
        # part of it was C's and waited at A for the heal.
        assert len(seen["c"]) > before_heal
        got = seen["b"] + seen["c"]
        assert sorted(got) == sorted(f"p-{i}" for i in range(40))  # each once, none lost
        await eventually(
            lambda: _stream_messages(trainer, names.prompts_stream.name, 0),
            timeout_s=60,
            what="A's prompt queue emptied by B's and C's acks",
        )
        lag = await trainer.consumer_lag(names.prompt_consumer)
        assert lag.backlog == 0
    finally:
        for plane in (trainer, *rollout.values()):
            await plane.close()


async def test_experience_of_both_rollout_sites_reaches_the_trainer_once(
    sites: ThreeSites,
) -> None:
    names = sites.names
    rollout = {d: await sites.rollout_site(d) for d in ROLLOUT_DOMAINS}
    trainer = await sites.trainer_site()
    try:
        for domain, plane in rollout.items():
            await plane.publish_many(
                [OutgoingMessage(names.scored, b"group", msg_id=f"{domain}-{i}") for i in range(15)]
            )
        got: list[Delivery] = await fetch_until(trainer, names.scored_consumer, 30, timeout_s=120)
        await asyncio.gather(*(d.ack() for d in got))
        ids = [str(d.msg_id) for d in got]
        assert sorted(ids) == sorted(f"{d}-{i}" for d in ROLLOUT_DOMAINS for i in range(15))
        assert await trainer.fetch(names.scored_consumer, batch=10, timeout_s=1.0) == []
        assert await _stream_messages(trainer, names.experience_stream.name, 30)
    finally:
        for plane in (trainer, *rollout.values()):
            await plane.close()


@pytest.mark.slow
async def test_a_weight_version_crosses_each_sites_link_once(sites: ThreeSites) -> None:
    names = sites.names
    transport = {"chunk_size": MiB}
    workers = {
        d: [await sites.rollout_site(d, weight_transport=transport) for _ in range(2)]
        for d in ROLLOUT_DOMAINS
    }
    trainer = await sites.trainer_site(weight_transport=transport)
    try:
        store = create_weight_store(trainer, reader_id="trainer")
        blob = torch.randint(0, 256, (3 * MiB,), dtype=torch.uint8).numpy().tobytes()
        before = {d: link.counters.to_downstream for d, link in sites.links.items()}
        ref = await store.put(1, blob)
        await trainer.publish(names.weight_events, ref.uri.encode(), msg_id="weights-1")

        async def read(plane: JetStreamPlane, reader: str) -> bytes:
            event = await eventually(plane.current_weight_event, timeout_s=60, what="v1")
            assert event is not None and event.data == ref.uri.encode()
            return await create_weight_store(plane, reader_id=reader).get_bytes(ref)

        got = await asyncio.gather(
            *(
                read(plane, f"{domain}-{i}")
                for domain, planes in workers.items()
                for i, plane in enumerate(planes)
            )
        )
        assert all(copy == blob for copy in got)
        for domain, link in sites.links.items():
            crossed = link.counters.to_downstream - before[domain]
            # One copy per site: two workers reading through the link would move 2x.
            assert len(blob) <= crossed < 1.5 * len(blob), (domain, crossed)
    finally:
        for plane in (trainer, *(p for planes in workers.values() for p in planes)):
            await plane.close()
