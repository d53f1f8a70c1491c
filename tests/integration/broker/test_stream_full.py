"""A full stream refuses new messages instead of dropping ones no one has read (issue 44).

The chaos run: with ``data_plane.streams.max_bytes`` reached, the experience stream's
``discard: old`` deleted groups the broker had acknowledged before any scorer or the trainer read
them. Here a real nats-server's experience stream fills while nothing reads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from broker_test_utils import eventually

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import StreamFull
from dockyard.config.sections.data_plane import DataPlaneConfig

KiB = 1024
#: Small enough that a few dozen 1 KiB messages fill it.
MAX_BYTES = 16 * KiB
BODY = 1 * KiB
MESSAGES = 30  # about twice what the stream holds


def body(index: int) -> bytes:
    return index.to_bytes(4, "little") * (BODY // 4)


async def test_a_full_experience_stream_keeps_what_no_one_read_and_its_publishers_wait(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = data_plane_config_factory(nats_server.url, streams={"max_bytes": MAX_BYTES})
    async with JetStreamPlane(config) as plane:
        names = plane.names
        stream = names.experience_stream.name

        async def publish_all() -> None:
            for index in range(MESSAGES):
                await plane.publish(names.rollouts, body(index), msg_id=f"rollout-{index}")

        publishing = asyncio.create_task(publish_all())

        async def full() -> bool:
            room = await plane.stream_room(stream)
            return room is not None and room.full

        try:
            await eventually(full, what="the experience stream full")
            # The oldest message, which no one has read, is still there (discard old deleted it).
            first = await plane.get(stream, 1)
            assert first.data == body(0)
            assert not publishing.done()  # waiting for room, not dropping old messages
            # A scorer reads and acknowledges: only then may the history go (the trainer's
            # trim), and the waiting publisher stores the rest.
            read: dict[bytes, int] = {}  # body -> times delivered
            while not publishing.done() or len(read) < MESSAGES:
                # Acked at once: delivery is at-least-once, and a late ack is redelivered.
                deliveries = await plane.fetch(names.rollout_consumer, batch=8, timeout_s=1.0)
                for delivery in deliveries:
                    read[delivery.data] = read.get(delivery.data, 0) + 1
                    await delivery.ack()
                lag = await plane.consumer_lag(names.rollout_consumer)
                await plane.trim_history(names.rollouts, lag.ack_floor + 1)
                assert deliveries or not publishing.done(), "nothing left to read"
            await asyncio.wait_for(publishing, timeout=10)
        finally:
            publishing.cancel()
        # Every message was read, in order: none was dropped to make room.
        assert list(read) == [body(index) for index in range(MESSAGES)]


async def test_a_stream_that_stays_full_fails_the_publish_naming_it(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = data_plane_config_factory(
        nats_server.url,
        streams={"max_bytes": MAX_BYTES},
        publish={"full_stream_wait_s": 0.5},
    )
    async with JetStreamPlane(config) as plane:
        names = plane.names
        with pytest.raises(StreamFull) as refused:
            for index in range(MESSAGES):
                await plane.publish(names.scored, body(index), msg_id=f"scored-{index}")
        assert refused.value.stream == names.experience_stream.name
        assert names.experience_stream.name in str(refused.value)
        assert "full_stream_wait_s" in str(refused.value)
        # What was stored before stays, from the first message on.
        assert (await plane.get(names.experience_stream.name, 1)).data == body(0)
