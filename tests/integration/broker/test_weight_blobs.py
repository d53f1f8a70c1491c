"""Weight blobs over every transport: round trips, digest verification, retention."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from dockyard.broker.weight_blobs import BlobDigestMismatch, BlobNotFound, WeightBlobStore
from dockyard.broker.weight_blobs import create_weight_store as make_store
from dockyard.broker.weight_blobs.base import BlobRef
from dockyard.broker.weight_blobs.files import FilesystemBlobStore
from dockyard.broker.weight_blobs.jetstream_blobs import JetStreamBlobStore
from dockyard.broker.weight_blobs.manifest import BlobManifestError

MiB = 1024 * 1024


@pytest.fixture
async def store(blob_plane) -> AsyncIterator[WeightBlobStore]:
    # chunk_size: several chunks even for small test blobs
    async with blob_plane(keep_last_versions=2, retention_grace_s=60.0, chunk_size=MiB) as plane:
        yield make_store(plane)


async def test_bytes_round_trip_verified(store: WeightBlobStore, tmp_path: Path) -> None:
    data = torch.randint(0, 256, (3 * MiB + 7,), dtype=torch.uint8).numpy().tobytes()
    ref = await store.put(1, data)
    assert ref.digest.startswith("sha256:") and ref.nbytes == len(data)
    assert await store.get_bytes(ref) == data
    written = await store.get_to_path(ref, tmp_path / "copy.bin")
    assert written.read_bytes() == data


async def test_tensors_and_files_round_trip(store: WeightBlobStore, tmp_path: Path) -> None:
    tensors = {"layer.weight": torch.randn(64, 32), "layer.bias": torch.arange(5.0)}
    ref = await store.put(3, tensors)
    loaded = await store.get_tensors(ref)
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    source = tmp_path / "weights.safetensors"
    source.write_bytes(await store.get_bytes(ref))
    again = await store.put(4, source)
    assert again.digest == ref.digest  # content-addressed: same bytes, same name


async def test_a_store_of_another_role_reads_what_the_trainer_put(blob_plane) -> None:
    # Every role makes its own store over the plane (its own reader id and leases); on the
    # in-memory plane that is each role of one process, sharing the one MemoryPlane.
    async with blob_plane(keep_last_versions=2, retention_grace_s=60.0) as plane:
        ref = await make_store(plane).put(1, b"weights" * 100)
        worker_store = make_store(plane, reader_id="worker-1")
        assert await worker_store.get_bytes(ref) == b"weights" * 100


async def test_a_blob_that_does_not_match_its_digest_is_refused(store: WeightBlobStore) -> None:
    ref = await store.put(1, b"genuine weights" * 1000)
    forged = BlobRef(ref.version, "sha256:" + "0" * 64, ref.nbytes, ref.uri, ref.created_at_unix_s)
    with pytest.raises(BlobNotFound):
        await store.get_bytes(forged)
    await _tamper(store, ref)
    with pytest.raises(BlobDigestMismatch, match="refusing to load"):
        await store.get_bytes(ref)


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (b"{not json", "unreadable"),
        (b'{"version": 1, "digest": "sha256:%s", "created_at_unix_s": 1.0}', "nbytes"),
        (
            b'{"version": 1, "digest": "sha256:%s", "nbytes": "big", "created_at_unix_s": 1.0}',
            "int",
        ),
        (
            b'{"version": 1, "digest": "sha256:%s", "nbytes": 3, "created_at_unix_s": 1, "x": 1}',
            "x",
        ),
        (b'{"version": 1, "digest": "sha256:%s", "nbytes": 3, "created_at_unix_s": 1.0}', "names"),
    ],
    ids=["not-json", "missing-field", "wrong-type", "unknown-field", "another-blob"],
)
async def test_a_damaged_manifest_is_refused_with_where_it_is(
    store: WeightBlobStore, manifest: bytes, reason: str
) -> None:
    """Manifests are read by other processes and sites: one that is not what a store writes is
    a clear error naming it, not a KeyError or JSON error from inside a refit."""
    if not isinstance(store, JetStreamBlobStore | FilesystemBlobStore):
        pytest.skip("the in-memory store keeps refs, not manifests")
    ref = await store.put(1, b"genuine weights" * 1000)
    named = ref.hex if reason != "names" else "0" * 64  # the last case names another blob
    damaged = manifest.replace(b"%s", named.encode())
    if isinstance(store, JetStreamBlobStore):
        where = store.names.blob_manifest_subject(ref.hex)
        await store.plane.js.purge_stream(store.names.blobs_stream.name, subject=where)
        await store.plane.js.publish(where, damaged)
    else:
        where = str(store.directory / f"{ref.hex}.json")
        Path(where).write_bytes(damaged)
    with pytest.raises(BlobManifestError, match=reason) as refused:
        await store.refs()
    assert where in str(refused.value)
    if isinstance(store, JetStreamBlobStore):  # it reads the manifest to fetch the chunks
        with pytest.raises(BlobManifestError, match=reason):
            await store.get_bytes(ref)


async def _tamper(store: WeightBlobStore, ref: BlobRef) -> None:
    """Replace the stored bytes behind the store's back, as corruption on disk or wire would."""
    evil = b"tampered weights" * 1000
    if isinstance(store, JetStreamBlobStore):
        subject = store.names.blob_data_subject(ref.hex)
        await store.plane.js.purge_stream(store.names.blobs_stream.name, subject=subject)
        await store.plane.js.publish(subject, evil[: ref.nbytes].ljust(ref.nbytes, b"x"))
    elif isinstance(store, FilesystemBlobStore):
        (store.directory / f"{ref.hex}.blob").write_bytes(evil)
    else:
        store._blobs[ref.digest] = (ref, evil)  # type: ignore[attr-defined]


async def test_retention_keeps_the_last_versions_after_a_grace_period(
    store: WeightBlobStore,
) -> None:
    refs = [await store.put(version, f"weights v{version}".encode() * 100) for version in range(4)]
    assert [r.version for r in await store.refs()] == [0, 1, 2, 3]
    # just after v3 was put, v0..v1 are beyond keep_last=2 but inside the grace period
    assert await store.prune(now=time.time()) == []
    pruned = await store.prune(now=time.time() + 3600)
    assert sorted(r.version for r in pruned) == [0, 1]
    assert [r.version for r in await store.refs()] == [2, 3]
    with pytest.raises(BlobNotFound):
        await store.get_bytes(refs[0])
    assert await store.get_bytes(refs[3]) == b"weights v3" * 100
