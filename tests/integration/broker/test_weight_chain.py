"""Version chains over every weight transport: snapshots and patches, catch-up, retention.

The trainer side (``ChainPublisher``) and worker side (``ChainFollower``) meet only through a
real store (JetStream chunks on a real nats-server, a shared directory, HTTP, memory), as the
trainer and a rollout worker do.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import torch

from dockyard.broker.plane import DataPlane
from dockyard.broker.weight_blobs import BlobNotFound, WeightBlobStore, create_weight_store
from dockyard.broker.weight_blobs.chain import ChainFollower, ChainPublisher, PublishedBlob
from dockyard.broker.weight_blobs.patch import (
    PATCH_FORMAT,
    SNAPSHOT_FORMAT,
    ChainLink,
    PatchError,
    PatchHeader,
    encode_patch,
    state_digest,
)
from dockyard.schemas import WeightVersion

SNAPSHOT_EVERY = 4
FAR_FUTURE = time.time() + 10 * 365 * 86400.0


@pytest.fixture
async def plane(blob_plane) -> AsyncIterator[DataPlane]:
    # keep_last_versions=1: only the chain keeps older blobs alive.
    async with blob_plane(keep_last_versions=1, retention_grace_s=0.0) as plane:
        yield plane


def _trajectory(versions: int) -> list[dict[str, torch.Tensor]]:
    """Published (bf16) weights of ``versions`` optimizer steps on float32 master weights: most
    elements stay bit-identical from one version to the next, as at RL learning rates."""
    generator = torch.Generator().manual_seed(0)
    master = {"w": torch.randn(256, 128, generator=generator) * 0.02, "n": torch.ones(128)}
    out = []
    for _ in range(versions):
        out.append({name: t.to(torch.bfloat16) for name, t in master.items()})
        for t in master.values():
            t.add_(torch.randn(t.shape, generator=generator).sign() * 1e-6)
    return out


def _event(version: int, blob: PublishedBlob) -> WeightVersion:
    return WeightVersion(
        version=version,
        step=version,
        blob_ref=blob.ref.uri,
        digest=blob.ref.digest,
        nbytes=blob.ref.nbytes,
        format=blob.format,
        delta_base_version=blob.delta_base_version,
        created_at_unix_s=time.time(),
        producer_id="trainer-test",
    )


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(
        torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a
    )


async def _publish_all(
    store: WeightBlobStore, states: list[dict[str, torch.Tensor]]
) -> tuple[ChainPublisher, list[WeightVersion]]:
    publisher = ChainPublisher(store, enabled=True, snapshot_every=SNAPSHOT_EVERY)
    events = []
    for version, state in enumerate(states):
        events.append(_event(version, await publisher.publish(version, state)))
        await store.prune(now=FAR_FUTURE, needed=publisher.needed)
    return publisher, events


async def test_a_snapshot_every_n_versions_and_patches_in_between(plane: DataPlane) -> None:
    states = _trajectory(2 * SNAPSHOT_EVERY + 1)
    _, events = await _publish_all(create_weight_store(plane), states)
    formats = [e.format for e in events]
    # snapshot_every=4: v0 snapshot, v1–v3 patches, v4 snapshot, ...
    assert formats == [SNAPSHOT_FORMAT, *[PATCH_FORMAT] * 3] * 2 + [SNAPSHOT_FORMAT]
    assert [e.delta_base_version for e in events[:4]] == [None, 0, 1, 2]
    assert all(e.nbytes < events[0].nbytes / 10 for e in events[1:4])


async def test_a_worker_on_every_version_applies_each_patch_bit_identically(
    plane: DataPlane,
) -> None:
    store = create_weight_store(plane)
    publisher = ChainPublisher(store, enabled=True, snapshot_every=SNAPSHOT_EVERY)
    follower = ChainFollower(create_weight_store(plane, reader_id="worker-1"), retain=True)
    for version, state in enumerate(_trajectory(SNAPSHOT_EVERY + 2)):  # over a new snapshot
        event = _event(version, await publisher.publish(version, state))
        await store.prune(now=FAR_FUTURE, needed=publisher.needed)
        assert _same(await follower.resolve(event), state)
    assert follower.catch_ups == 0


async def test_a_worker_that_missed_a_patch_catches_up_along_the_chain(plane: DataPlane) -> None:
    states = _trajectory(SNAPSHOT_EVERY)
    _, events = await _publish_all(create_weight_store(plane), states)
    follower = ChainFollower(create_weight_store(plane, reader_id="worker-1"), retain=True)
    await follower.resolve(events[0])
    await follower.resolve(events[1])
    # v2's event never reached it (a dropped watch, a restart of the watch): v3 says "on v2".
    assert _same(await follower.resolve(events[3]), states[3])
    assert follower.catch_ups == 1 and follower.version == 3


async def test_a_late_joiner_reads_the_snapshot_and_the_patches_after_it(
    plane: DataPlane,
) -> None:
    states = _trajectory(SNAPSHOT_EVERY + 3)  # v4 snapshot, v5 and v6 patches
    _, events = await _publish_all(create_weight_store(plane), states)
    late = ChainFollower(create_weight_store(plane, reader_id="late-worker"), retain=True)
    assert _same(await late.resolve(events[-1]), states[-1])
    assert late.catch_ups == 1


async def test_retention_keeps_the_chain_and_lets_the_previous_one_go(plane: DataPlane) -> None:
    store = create_weight_store(plane)
    states = _trajectory(SNAPSHOT_EVERY + 2)
    publisher, events = await _publish_all(store, states[:SNAPSHOT_EVERY])
    # keep_last_versions=1, no grace: only the chain (snapshot v0 + patches v1, v2) outlives v3.
    assert sorted(r.version for r in await store.refs()) == [0, 1, 2, 3]
    # The next snapshot (v4) starts a new chain: the old one is no longer needed.
    for version in (4, 5):
        events.append(_event(version, await publisher.publish(version, states[version])))
        await store.prune(now=FAR_FUTURE, needed=publisher.needed)
    assert events[4].format == SNAPSHOT_FORMAT and events[5].format == PATCH_FORMAT
    assert sorted(r.version for r in await store.refs()) == [4, 5]
    late = ChainFollower(create_weight_store(plane, reader_id="late-worker"), retain=True)
    assert _same(await late.resolve(events[5]), states[5])
    # A worker still on the old chain cannot patch onto it any more: it is told why.
    stuck = ChainFollower(create_weight_store(plane, reader_id="old-worker"), retain=True)
    with pytest.raises(BlobNotFound):
        await stuck.resolve(events[2])


async def test_an_event_that_contradicts_its_patch_is_refused_and_the_weights_stay(
    plane: DataPlane,
) -> None:
    states = _trajectory(3)
    _, events = await _publish_all(create_weight_store(plane), states)
    follower = ChainFollower(create_weight_store(plane, reader_id="worker-1"), retain=True)
    await follower.resolve(events[0])
    await follower.resolve(events[1])
    lying = msgspec.structs.replace(events[2], version=7, delta_base_version=6)
    with pytest.raises(PatchError, match="the event says a patch on v6, the blob is v2 on v1"):
        await follower.resolve(lying)
    # (a format other than a patch carries no delta base: the wire refuses one that does)
    unknown = msgspec.structs.replace(events[2], format="pickle", delta_base_version=None)
    with pytest.raises(PatchError, match="unknown weight blob format 'pickle'"):
        await follower.resolve(unknown)
    assert follower.version == 1
    assert _same(await follower.resolve(events[2]), states[2])
    assert follower.catch_ups == 0


async def test_a_patch_whose_result_is_not_what_it_claims_is_refused_and_the_weights_stay(
    plane: DataPlane,
) -> None:
    store = create_weight_store(plane)
    states = _trajectory(3)
    publisher, events = await _publish_all(store, states[:2])
    follower = ChainFollower(create_weight_store(plane, reader_id="worker-1"), retain=True)
    for event in events:
        await follower.resolve(event)
    # A stored, correctly addressed patch whose elements do not make the weights it names.
    header = PatchHeader(
        version=2,
        base_version=1,
        base_digest=state_digest(states[1]),
        result_digest=state_digest(states[2]),
        snapshot=ChainLink(0, events[0].digest, events[0].nbytes),
        chain=(ChainLink(1, events[1].digest, events[1].nbytes),),
    )
    tampered = {name: t.clone() for name, t in states[2].items()}
    tampered["w"][0, 0] = 1.0
    blob, _ = encode_patch(states[1], tampered, header)
    forged = await store.put(2, blob)
    event = _event(2, PublishedBlob(forged, PATCH_FORMAT, 1, None))
    with pytest.raises(PatchError, match="refusing them"):
        await follower.resolve(event)
    assert follower.version == 1  # still the weights it had, and still patchable
    genuine = _event(2, await publisher.publish(2, states[2]))
    assert _same(await follower.resolve(genuine), states[2])
    assert follower.catch_ups == 0


async def test_the_trainer_may_publish_its_live_tensors_and_step_them_in_place(
    plane: DataPlane,
) -> None:
    # float32 weights on the CPU are published without a copy: the optimizer then changes the
    # very tensors the publisher was given.
    store = create_weight_store(plane)
    publisher = ChainPublisher(store, enabled=True, snapshot_every=SNAPSHOT_EVERY)
    follower = ChainFollower(create_weight_store(plane, reader_id="worker-1"), retain=True)
    live = {"w": torch.zeros(64, 64)}
    for version in range(3):
        event = _event(version, await publisher.publish(version, live))
        expected = {"w": live["w"].clone()}
        resolved = await follower.resolve(event)
        assert torch.equal(resolved["w"], expected["w"])
        live["w"][version, :8] += 1.0  # an in-place step: a few elements change
    assert event.format == PATCH_FORMAT
