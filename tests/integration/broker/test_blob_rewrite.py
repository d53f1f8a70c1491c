"""A weight blob whose publish was interrupted can be published again, at any time after.

The chaos run of issue 44: a trainer killed after some of a blob's chunks were stored (no
manifest yet) and restarted after the broker's duplicate window re-published the version onto
the same data subject, which then held more chunks than its manifest named; no worker could read
it. Here the crash is a publish that stops after some chunks, on a real nats-server with a short
duplicate window, and the same bytes are then published again inside and past the window.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.broker.weight_blobs.jetstream_blobs import JetStreamBlobStore
from dockyard.config.sections.data_plane import DataPlaneConfig

KiB = 1024
#: The broker's duplicate window in these tests: short, so a restart can come after it.
WINDOW_S = 1.0
CHUNK = 64 * KiB


class Killed(Exception):
    """Stands for the trainer process dying in the middle of a publish."""


def blob_bytes() -> bytes:
    # 10 chunks and a short last one; not a repeating pattern, so a misplaced chunk shows.
    return b"".join(hashlib.sha256(i.to_bytes(4, "little")).digest() for i in range(20_500))


def dies_after(plane: JetStreamPlane, stored: int) -> None:
    """``plane.publish_many`` stores the first ``stored`` messages it is given, then "dies"."""
    real = plane.publish_many

    async def publish_some(messages: list[OutgoingMessage], **kwargs: Any) -> Any:
        await real(messages[:stored], **kwargs)
        raise Killed

    plane.publish_many = publish_some  # type: ignore[method-assign]


async def data_subject_count(plane: JetStreamPlane, hex_digest: str) -> int:
    subject = plane.names.blob_data_subject(hex_digest)
    info = await plane.js.stream_info(plane.names.blobs_stream.name, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


def open_store(plane: JetStreamPlane) -> JetStreamBlobStore:
    store = create_weight_store(plane)
    assert isinstance(store, JetStreamBlobStore)
    return store


async def interrupted_put(config: DataPlaneConfig, data: bytes, stored: int) -> None:
    """A trainer that stores ``stored`` chunks of version 7's blob and dies before its manifest."""
    async with JetStreamPlane(config) as plane:
        dies_after(plane, stored)
        with pytest.raises(Killed):
            await open_store(plane).put(7, data)


@pytest.mark.parametrize("restart", ["inside_the_window", "past_the_window"])
async def test_a_blob_interrupted_mid_publish_is_published_again_whole(
    restart: str,
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = data_plane_config_factory(
        nats_server.url,
        streams={"duplicate_window_s": WINDOW_S},
        weight_transport={"chunk_size": CHUNK},
    )
    data = blob_bytes()
    chunks = -(-len(data) // CHUNK)
    assert chunks == 11
    await interrupted_put(config, data, stored=4)
    if restart == "past_the_window":
        # The condition under test is the broker forgetting the first attempt's message ids,
        # which happens only when the window's time has passed: nothing to wait on but time.
        await asyncio.sleep(WINDOW_S * 1.5)
    async with JetStreamPlane(config) as plane:  # the restarted trainer
        store = open_store(plane)
        ref = await store.put(7, data)
        assert ref.nbytes == len(data)
        # The data subject holds exactly the chunks its manifest names (wire-format.md).
        assert await data_subject_count(plane, ref.hex) == chunks
        assert ref.digest == "sha256:" + hashlib.sha256(data).hexdigest()
        # A worker's store reads it back whole and digest-verified.
        worker = create_weight_store(plane, reader_id="worker-1")
        assert await worker.get_bytes(ref) == data


async def test_a_reader_skips_an_interrupted_writes_chunks_left_before_the_blob(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    """A rollout site's mirror copies the crashed attempt's chunks but not the origin's purge of
    them: there the data subject holds the partial write, then the whole one. Made here by a
    re-publish that does not purge first."""
    config = data_plane_config_factory(
        nats_server.url,
        streams={"duplicate_window_s": WINDOW_S},
        weight_transport={"chunk_size": CHUNK},
    )
    data = blob_bytes()
    await interrupted_put(config, data, stored=6)
    async with JetStreamPlane(config) as plane:
        purged: list[str] = []

        async def no_purge(subject: str) -> None:
            purged.append(subject)

        plane.purge = no_purge  # type: ignore[method-assign]
        store = open_store(plane)
        ref = await store.put(7, data)
        assert purged  # the writer did try to clear the partial chunks
        assert await data_subject_count(plane, ref.hex) == 6 + 11
        assert await create_weight_store(plane, reader_id="w").get_bytes(ref) == data
