"""A full experience stream is trimmed of the history no role needs, and of nothing else, and the
trainer's diagnosis names it (issue 44: a full stream must not block training forever, nor drop
what no one has read). A real nats-server; the trainer's own pieces."""

from __future__ import annotations

from collections.abc import Callable

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.consumers.trainer.health import diagnose
from dockyard.consumers.trainer.history_trim import HistoryTrim
from tests.integration.broker.broker_test_utils import eventually

KiB = 1024
MAX_BYTES = 16 * KiB
GROUPS = 7  # 7 raw + 7 scored messages of 1 KiB: over 90 % of 16 KiB


def body(kind: str, index: int) -> bytes:
    return (f"{kind}{index:02d}".encode() * KiB)[:KiB]


async def fill(plane: JetStreamPlane) -> dict[int, bytes]:
    """Raw and scored rollouts in turn, as a fleet stores them; their bodies by sequence."""
    names, stored = plane.names, {}
    for index in range(GROUPS):
        for subject, kind in ((names.rollouts, "r"), (names.scored, "s")):
            ack = await plane.publish(subject, body(kind, index), msg_id=f"{kind}{index}")
            stored[ack.seq] = body(kind, index)
    return stored


async def read_and_ack(plane: JetStreamPlane, consumer, count: int) -> int:  # type: ignore[no-untyped-def]
    """Read ``count`` messages in order and ack them; the consumer's ack floor after."""
    taken = 0
    while taken < count:
        for delivery in await plane.fetch(consumer, batch=count - taken, timeout_s=1.0):
            await delivery.ack()
            taken += 1

    async def floor() -> int:
        lag = await plane.consumer_lag(consumer)
        return lag.ack_floor if lag.ack_pending == 0 else 0

    return await eventually(floor, what="the acks recorded")


async def left(plane: JetStreamPlane, stored: dict[int, bytes]) -> set[int]:
    out = set()
    for seq in stored:
        try:
            await plane.get(plane.names.experience_stream.name, seq)
        except KeyError:
            continue
        out.add(seq)
    return out


async def test_only_history_no_one_needs_is_trimmed_when_the_stream_is_full(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = data_plane_config_factory(nats_server.url, streams={"max_bytes": MAX_BYTES})
    async with JetStreamPlane(config) as plane:
        names = plane.names
        stored = await fill(plane)
        raw_seqs = [2 * i + 1 for i in range(GROUPS)]
        scored_seqs = [2 * i + 2 for i in range(GROUPS)]
        diagnosis = await diagnose(plane)
        assert diagnosis.full_streams and names.experience_stream.name in diagnosis.describe()
        assert diagnosis.describe().startswith(f"starving: stream {names.experience_stream.name}")
        # The scorers have scored four groups, the trainer taken five; its newest checkpoint
        # replays from the fourth scored group (seq 8).
        raw_floor = await read_and_ack(plane, names.rollout_consumer, 4)
        scored_floor = await read_and_ack(plane, names.scored_consumer, 5)
        assert (raw_floor, scored_floor) == (raw_seqs[3], scored_seqs[4])
        replay_point = scored_seqs[3]
        await HistoryTrim(plane, lambda: replay_point).check()
        kept = await left(plane, stored)
        # Raw rollouts scored: gone; not yet scored: kept. Scored groups before the checkpoint's
        # replay point: gone; the rest (acked or not) kept, as a resume would replay them.
        assert kept == set(raw_seqs[4:]) | set(scored_seqs[3:])
        for seq in kept:
            assert (await plane.get(names.experience_stream.name, seq)).data == stored[seq]
        room = await plane.stream_room(names.experience_stream.name)
        assert room is not None and not room.full


async def test_without_a_checkpoint_no_scored_group_is_trimmed(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = data_plane_config_factory(nats_server.url, streams={"max_bytes": MAX_BYTES})
    async with JetStreamPlane(config) as plane:
        names = plane.names
        stored = await fill(plane)
        await read_and_ack(plane, names.rollout_consumer, GROUPS)
        await read_and_ack(plane, names.scored_consumer, GROUPS)
        await HistoryTrim(plane, lambda: 0).check()  # a resume would replay the whole stream
        assert await left(plane, stored) == {2 * i + 2 for i in range(GROUPS)}


async def test_a_stream_with_room_keeps_all_its_history(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    config = data_plane_config_factory(nats_server.url, streams={"max_bytes": 4 * MAX_BYTES})
    async with JetStreamPlane(config) as plane:
        names = plane.names
        stored = await fill(plane)
        await read_and_ack(plane, names.rollout_consumer, GROUPS)
        await read_and_ack(plane, names.scored_consumer, GROUPS)
        await HistoryTrim(plane, lambda: 2 * GROUPS + 1).check()
        assert await left(plane, stored) == set(stored)
        assert not (await diagnose(plane)).full_streams
