"""Reader leases: retention never deletes a weight version while a worker fetches it.

Every transport (JetStream chunks, shared directory, HTTP, memory) over both planes' lease
records; the pruner's clock is passed explicitly, so "an hour later" needs no waiting.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import DataPlane
from dockyard.broker.weight_blobs import BlobNotFound, WeightBlobStore, create_weight_store
from dockyard.broker.weight_blobs.leases import BlobLeases, LeaseRecord
from dockyard.config.sections.data_plane import DataPlaneConfig

HOUR = 3600.0
LEASE_TTL_S = 2 * HOUR  # long enough that "an hour later" is still inside a live lease


@pytest.fixture
async def plane_and_store(blob_plane) -> AsyncIterator[tuple[DataPlane, WeightBlobStore]]:
    settings = {"keep_last_versions": 1, "retention_grace_s": 60.0}
    async with blob_plane(**settings, reader_lease_ttl_s=LEASE_TTL_S) as plane:
        yield plane, create_weight_store(plane, reader_id="trainer-0")


async def _two_versions(store: WeightBlobStore) -> list:
    return [await store.put(version, f"weights v{version}".encode() * 50) for version in (0, 1)]


async def test_a_leased_version_survives_pruning_until_released(
    plane_and_store: tuple[DataPlane, WeightBlobStore],
) -> None:
    plane, store = plane_and_store
    old, _new = await _two_versions(store)
    worker = BlobLeases(plane, ttl_s=LEASE_TTL_S, reader_id="rollout-worker-7")
    later = time.time() + HOUR  # far past the grace: only the lease keeps v0
    async with worker.hold(old.hex, old.version):
        assert await worker.live([old.hex], later) == {old.hex: ["rollout-worker-7"]}
        assert await store.prune(now=later) == []
        assert [r.version for r in await store.refs()] == [0, 1]
    assert await worker.live([old.hex], later) == {}  # released: the record says so
    assert [r.version for r in await store.prune(now=later)] == [0]
    assert [r.version for r in await store.refs()] == [1]
    # A deleted blob's lease records go with it: the leases stream holds only current ones.
    assert [m async for m in plane.replay(plane.names.leases_of(old.hex))] == []


async def test_a_dead_readers_lease_lapses(
    plane_and_store: tuple[DataPlane, WeightBlobStore],
) -> None:
    plane, store = plane_and_store
    old, _new = await _two_versions(store)
    # The last word of a worker that died mid-fetch: a lease it will never renew nor release.
    record = LeaseRecord(
        reader="crashed-worker", version=old.version, expires_at_unix_s=time.time() + LEASE_TTL_S
    )
    subject = plane.names.lease_subject(old.hex, "crashed-worker")
    await plane.publish(subject, record.model_dump_json().encode(), msg_id="last-lease")
    assert await store.prune(now=time.time() + HOUR) == []
    after_ttl = time.time() + LEASE_TTL_S + 1
    assert [r.version for r in await store.prune(now=after_ttl)] == [0]
    with pytest.raises(BlobNotFound):
        await store.get_bytes(old)


async def test_reads_through_the_store_hold_and_release_a_lease(
    plane_and_store: tuple[DataPlane, WeightBlobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    _plane, store = plane_and_store
    assert store.leases is not None
    ref = (await _two_versions(store))[1]
    during: dict[str, list[str]] = {}
    transport_read = store._read_bytes

    async def observed_read(ref):  # the real read, with a look at the leases while it runs
        during.update(await store.leases.live([ref.hex]))
        return await transport_read(ref)

    monkeypatch.setattr(store, "_read_bytes", observed_read)
    assert await store.get_bytes(ref) == b"weights v1" * 50
    assert during == {ref.hex: ["trainer-0"]}
    assert await store.leases.live([ref.hex]) == {}


async def test_a_long_fetch_keeps_renewing_its_lease(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    async with JetStreamPlane(data_plane_config_factory(nats_server.url)) as plane:
        ttl = 0.3
        leases = BlobLeases(plane, ttl_s=ttl, reader_id="slow-reader")
        renewals = plane.watch(plane.names.lease_subject("ab" * 32, "slow-reader"))
        async with leases.hold("ab" * 32, 5):
            first = LeaseRecord.model_validate_json((await anext(renewals)).data)
            # Wait for renewals (events, not sleeps) until the first expiry has passed.
            while time.time() <= first.expires_at_unix_s:
                record = LeaseRecord.model_validate_json((await anext(renewals)).data)
                assert record.expires_at_unix_s > first.expires_at_unix_s
            assert await leases.live(["ab" * 32]) == {"ab" * 32: ["slow-reader"]}
        await renewals.aclose()
        # One record per (blob, reader): renewals and the release replaced each other.
        state = {s.name: s for s in await plane.streams()}[plane.names.leases_stream.name]
        assert state.messages == 1
