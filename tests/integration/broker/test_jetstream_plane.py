"""JetStream-only behaviour: chunking of oversized payloads, provisioning drift, the typed layer."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Callable

import nats
import pytest
from broker_test_utils import collect, eventually, fetch_until
from nats.aio.client import Client as NatsClient
from structlog.testing import capture_logs

from dockyard.broker import exhausted, jetstream
from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import (
    HEADER_UNREADABLE,
    REASON_CHUNKS_MISSING,
    InsufficientStorage,
    LimitDifference,
    OutgoingMessage,
    ProvisioningDrift,
)
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import WeightVersion

MiB = 1024 * 1024
ConfigFactory = Callable[..., DataPlaneConfig]


@pytest.fixture
async def plane(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> AsyncIterator[JetStreamPlane]:
    async with JetStreamPlane(data_plane_config_factory(nats_server.url)) as started:
        yield started


@pytest.fixture
async def small_payload_plane(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> AsyncIterator[JetStreamPlane]:
    """Messages are capped at 1 MiB, so a few MiB already take the chunked path."""
    config = data_plane_config_factory(nats_server.url, max_payload=MiB)
    async with JetStreamPlane(config) as plane:
        yield plane


async def test_oversized_payload_is_chunked_and_reassembled_once(
    small_payload_plane: JetStreamPlane,
) -> None:
    plane = small_payload_plane
    names = plane.names
    payload = os.urandom(3 * MiB + 123)
    ack = await plane.publish(names.scored, payload, msg_id="big", headers={"X-A": "1"})
    again = await plane.publish(names.scored, payload, msg_id="big")
    assert again.duplicate and again.seq == ack.seq

    [delivery] = await fetch_until(plane, names.scored_consumer, 1)
    assert delivery.data == payload
    assert delivery.headers["X-A"] == "1"
    assert not any(key.startswith("Dockyard-Chunk") for key in delivery.headers)
    await delivery.ack()
    assert await plane.fetch(names.scored_consumer, timeout_s=0.3) == []

    # the chunks are in the side stream; history readers reassemble too
    states = {s.name: s for s in await plane.streams()}
    assert states[names.chunks_stream.name].messages == 4
    assert states[names.experience_stream.name].messages == 1
    [replayed] = await collect(plane, names.scored)
    assert replayed.data == payload
    assert (await plane.get(names.experience_stream.name, ack.seq)).data == payload


async def test_pipelined_publishes_past_the_clients_pending_slots_wait_for_a_slot(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: ConfigFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A window of 12 through 2 slots: every publish after the second waits for an ack to free
    # one (the timed wait), and each message is still stored once, in order.
    monkeypatch.setattr(jetstream, "PENDING_PUBLISH_SLOTS", 2)
    config = data_plane_config_factory(nats_server.url, publish={"window": 12})
    async with JetStreamPlane(config) as plane:
        subject = plane.names.scored
        messages = [OutgoingMessage(subject, b"%d" % i, f"slot-{i}", {}) for i in range(12)]
        with capture_logs() as events:
            acks = await plane.publish_many(messages)
        # Pipelined all the way: no publish fell back to the one-by-one path...
        assert not [e for e in events if e["event"] == "publish_async.fallback"]
        # ...and with slots free again, the next publish waits without a timer (the nats-py
        # internals this relies on are still there).
        assert plane._publisher.stall_timeout(5.0) is None
        assert [ack.seq for ack in acks] == list(range(1, 13))
        assert not any(ack.duplicate for ack in acks)
        stored = await collect(plane, subject)
        assert [message.data for message in stored] == [b"%d" % i for i in range(12)]


async def test_lost_chunks_turn_the_reference_into_a_dead_letter(
    small_payload_plane: JetStreamPlane,
) -> None:
    plane = small_payload_plane
    names = plane.names
    await plane.publish(names.scored, os.urandom(2 * MiB), msg_id="doomed")
    await plane.js.purge_stream(names.chunks_stream.name)
    await plane.publish(names.scored, b"fine", msg_id="fine")
    [delivery] = await fetch_until(plane, names.scored_consumer, 1)
    assert delivery.data == b"fine"
    [dead] = await collect(plane, names.dead_letters)
    assert read_dead_letter(dead).reason == REASON_CHUNKS_MISSING
    # Reading history does not stop there either: the message is there, empty, saying why.
    doomed, fine = await collect(plane, names.scored)
    assert doomed.data == b""
    assert doomed.headers[HEADER_UNREADABLE].startswith(f"{REASON_CHUNKS_MISSING}: chunk 0 of ")
    assert fine.data == b"fine" and HEADER_UNREADABLE not in fine.headers


async def test_provisioning_keeps_an_existing_streams_limits_unless_asked(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    # Issue 44: a stream that exists keeps its limits (a store is served as it was written, and
    # a smaller max_bytes would delete its oldest messages); the difference is reported, and
    # applied only when asked. Consumers keep no data: their settings are updated.
    config = data_plane_config_factory(nats_server.url)
    async with JetStreamPlane(config) as plane:
        experience = plane.names.experience_stream.name
        grown = config.model_copy(deep=True)
        grown.streams.max_msgs = 1000
        grown.consumer.max_deliver = 7
        async with JetStreamPlane(grown, provision=False) as second:
            report = await second.provision()
            assert LimitDifference(experience, "max_msgs", -1, 1000) in report.kept
            assert experience in report.unchanged and report.changed == ()
            assert plane.names.rollout_consumer.durable in report.updated
            info = await second.js.stream_info(experience)
            assert info.config.max_msgs == -1

            report = await second.provision(update_limits=True)
            assert experience in report.updated and report.kept == ()
            assert LimitDifference(experience, "max_msgs", -1, 1000) in report.changed
            info = await second.js.stream_info(experience)
            assert info.config.max_msgs == 1000

        moved = config.model_copy(deep=True)
        moved.streams.storage = "memory"
        with pytest.raises(
            ProvisioningDrift, match=r"storage: exists as file, config wants memory"
        ):
            async with JetStreamPlane(moved):
                pass


async def test_a_layout_update_carries_the_streams_own_limits(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    # What this code defines (direct gets, subjects, ...) is still updated in place; the update
    # keeps the limits the stream has.
    config = data_plane_config_factory(nats_server.url)
    async with JetStreamPlane(config) as plane:
        name = plane.names.experience_stream.name
        info = await plane.js.stream_info(name)
        older = dataclasses.replace(info.config, allow_direct=False, max_bytes=128 * MiB)
        await plane.js.update_stream(older)
        report = await plane.provision()
        assert name in report.updated
        assert LimitDifference(name, "max_bytes", 128 * MiB, 256 * MiB) in report.kept
        info = await plane.js.stream_info(name)
        assert info.config.allow_direct is True and info.config.max_bytes == 128 * MiB


async def test_a_server_that_cannot_reserve_the_streams_is_refused_with_the_numbers(
    nats_server_factory: Callable[..., EmbeddedNatsServer],
    data_plane_config_factory: ConfigFactory,
) -> None:
    # JetStream reserves each file stream's max_bytes when it creates it (docs/operations.md):
    # six streams at 256 MiB, the heartbeats at 64 MiB, do not fit in a 1 GiB file store.
    server = nats_server_factory(max_file_store=1024 * MiB)
    config = data_plane_config_factory(server.url)
    assert config.streams.max_bytes == 256 * MiB
    with pytest.raises(InsufficientStorage) as refused:
        async with JetStreamPlane(config):
            pass
    text = str(refused.value)
    assert "code 10047" in text
    assert f"{6 * 256 * MiB + 64 * MiB} bytes" in text  # the namespace's streams in all
    assert "data_plane.streams.max_bytes" in text and "max_file_store" in text
    assert "created before the refusal" in text


def _weight_version(version: int) -> WeightVersion:
    return WeightVersion(
        version=version,
        step=version,
        blob_ref=f"blob://v{version}",
        digest="sha256:" + f"{version:064x}",
        nbytes=10,
        created_at_unix_s=1.0,
        producer_id="trainer-0",
    )


async def test_typed_layer_dead_letters_poison_and_carries_on(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    async with JetStreamPlane(data_plane_config_factory(nats_server.url)) as plane:
        typed = MessagePlane(plane, stage="test-stage")
        names = plane.names
        consumer = ConsumerSpec(
            f"{names.namespace}_weights_test", names.weights_stream.name, names.weight_events
        )
        await typed.publish(_weight_version(1))
        await plane.publish(names.weight_events, b"\x28\xb5\x2f\xfd garbage", msg_id="poison")
        await typed.publish(_weight_version(2))

        received = []
        while len(received) < 2:
            batch = await typed.fetch(consumer, WeightVersion, timeout_s=2)
            assert batch, "the consumer stalled"
            for item in batch:
                received.append(item.message.version)
                await item.ack()
        assert received == [1, 2]
        assert sum(typed.dead_lettered.values()) == 1
        [dead] = await eventually(lambda: collect(plane, names.dead_letters), what="dead letter")
        letter = read_dead_letter(dead)
        assert letter.stage == "test-stage"
        assert letter.reason in typed.dead_lettered
        assert letter.original_payload == b"\x28\xb5\x2f\xfd garbage"
        current = await typed.current_weight_version()
        assert current is not None and current.version == 2


async def test_deliveries_not_handed_out_are_returned_when_the_plane_closes(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    # A long poll returns with its first message; the rest of its batch arrives afterwards and
    # waits for the next fetch. A consumer that stops before then gives them back at once
    # (the ack wait here is 60 s: without that they would be invisible for a minute).
    config = data_plane_config_factory(nats_server.url, consumer={"ack_wait_s": 60})
    async with JetStreamPlane(config) as producer:
        names = producer.names
        consumer = JetStreamPlane(config)
        await consumer.start()
        try:
            polling = asyncio.ensure_future(consumer.fetch(names.rollout_consumer, 8, 10))
            await eventually(lambda: _waiting_pulls(producer, names.rollout_consumer))
            for index in range(6):  # one by one: they reach the long poll one after another
                await producer.publish(names.rollouts, b"%d" % index, msg_id=f"left-{index}")
            handed_out = await polling
        finally:
            await consumer.close()
        assert 1 <= len(handed_out) < 6
        async with JetStreamPlane(config) as other:
            rest = await fetch_until(other, names.rollout_consumer, 6 - len(handed_out))
        seen = sorted(d.data for d in [*handed_out, *rest])
        assert seen == sorted(b"%d" % i for i in range(6))


async def _waiting_pulls(plane: JetStreamPlane, spec) -> bool:
    info = await plane.js.consumer_info(spec.stream, spec.durable)
    return bool(info.num_waiting)


async def test_a_pipelined_publish_that_never_goes_out_gives_its_slot_back(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: ConfigFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nats-py takes a pending slot and registers the ack's future before it hands the message
    # to the connection; when that raises (here: the outbound buffer full while reconnecting),
    # nothing would ever complete the future and the slot would stay taken for good. With two
    # slots, two such failures would make every later pipelined publish stall for a timeout.
    monkeypatch.setattr(jetstream, "PENDING_PUBLISH_SLOTS", 2)
    config = data_plane_config_factory(nats_server.url, publish={"window": 4, "timeout_s": 5})
    async with JetStreamPlane(config) as plane:
        subject = plane.names.scored
        real_publish = NatsClient.publish
        failures = 2

        async def failing_publish(client: NatsClient, *args: object, **kwargs: object) -> None:
            nonlocal failures
            if failures:
                failures -= 1
                raise nats.errors.OutboundBufferLimitError
            await real_publish(client, *args, **kwargs)  # type: ignore[arg-type]

        # nats-py's own publish fails, as it does while reconnecting with a full buffer.
        monkeypatch.setattr(NatsClient, "publish", failing_publish)
        first = [OutgoingMessage(subject, b"%d" % i, f"unsent-{i}", {}) for i in range(2)]
        with capture_logs() as events:
            acks = await plane.publish_many(first)  # both fall back to the retrying path
        assert [e["messages"] for e in events if e["event"] == "publish_async.fallback"] == [2]
        assert [ack.seq for ack in acks] == [1, 2]
        assert plane.js.publish_async_pending() == 0

        second = [OutgoingMessage(subject, b"%d" % i, f"sent-{i}", {}) for i in range(2, 6)]
        started = asyncio.get_running_loop().time()
        with capture_logs() as events:
            acks = await plane.publish_many(second)
        assert not [e for e in events if e["event"] == "publish_async.fallback"]
        assert asyncio.get_running_loop().time() - started < 5  # no stall on a lost slot
        assert [ack.seq for ack in acks] == [3, 4, 5, 6]
        stored = await collect(plane, subject)
        assert [message.data for message in stored] == [b"%d" % i for i in range(6)]


async def test_every_plane_watching_a_work_queue_turns_an_exhausted_message_into_one_letter(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    # Both planes pull from the prompt consumer, so both hear the max-deliveries advisory; both
    # dead-letter the prompt (deduplicated into one letter) and both remove it from the work
    # queue: the second removal finds it gone, which is not an error.
    config = data_plane_config_factory(nats_server.url, consumer={"max_deliver": 1})
    async with JetStreamPlane(config) as first, JetStreamPlane(config) as second:
        names = first.names
        assert await second.fetch(names.prompt_consumer, timeout_s=0.1) == []  # watching too
        await first.publish(names.prompts, b"exhausted", msg_id="exhausted")
        with capture_logs() as events:
            [delivery] = await fetch_until(first, names.prompt_consumer, 1)
            await delivery.nak()

            async def prompt_removed() -> bool:
                # The server notices the exhausted prompt when it next tries to deliver.
                assert await first.fetch(names.prompt_consumer, timeout_s=0.2) == []
                states = {s.name: s for s in await first.streams()}
                return states[names.prompts_stream.name].messages == 0

            await eventually(prompt_removed, what="the prompt leaves the work queue")
            letters = await eventually(
                lambda: collect(first, names.dead_letters), what="a dead letter", timeout_s=10
            )
            # Each plane either dead-letters it or finds it removed already.
            await eventually(
                lambda: _count_events(
                    events, {"dead_letter.max_deliveries", "dead_letter.already_removed"}, 2
                ),
                what="both planes handled the advisory",
            )
        assert len(letters) == 1
        assert read_dead_letter(letters[0]).original_payload == b"exhausted"
        assert [e for e in events if e["log_level"] == "error"] == []


async def _count_events(events: list[dict[str, object]], names: set[str], count: int) -> bool:
    return len([e for e in events if e["event"] in names]) >= count


async def _publish_numbered(plane: JetStreamPlane, subject: str, count: int, prefix: str) -> None:
    """``count`` messages ``b"0"``, ``b"1"``… with ids ``<prefix>-<i>``."""
    for index in range(count):
        await plane.publish(subject, b"%d" % index, msg_id=f"{prefix}-{index}")


async def test_deliveries_read_from_the_subscriptions_queue_keep_its_accounting(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    # The pull channel takes deliveries from nats-py's own subscription queue: it must count
    # them out as nats-py's readers do, or the client's pending figures grow without end and
    # anything that waits for the queue to be processed (a drain) never returns.
    config = data_plane_config_factory(nats_server.url)
    async with JetStreamPlane(config) as plane:
        names = plane.names
        await _publish_numbered(plane, names.rollouts, 20, "acct")
        deliveries = await fetch_until(plane, names.rollout_consumer, 20)
        for delivery in deliveries:
            await delivery.ack()
        assert sorted(d.msg_id for d in deliveries) == sorted(f"acct-{i}" for i in range(20))
        inbox = next(
            sub
            for sub in plane.nc._subs.values()
            if sub.subject.startswith(plane.nc._inbox_prefix.decode())
            and sub._pending_queue is plane._channels[names.rollout_consumer.durable]._queue
        )
        # What is left is at most the status that ended the last pull request: no data.
        assert inbox.pending_bytes == 0
        assert all(not msg.data for msg in inbox._pending_queue._queue)
    async with asyncio.timeout(5):  # closing the plane took the rest: nothing left undone
        await inbox._pending_queue.join()
    assert inbox.pending_msgs == 0


async def _exhaust_without_a_plane(url: str, spec) -> None:
    """Deliver the consumer's next message until the server gives up on it, with plain nats-py:
    no plane is there to hear the max-deliveries advisory."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        subscription = await js.pull_subscribe_bind(spec.durable, stream=spec.stream)
        [msg] = await subscription.fetch(1, timeout=5)
        await msg.nak()

        async def given_up() -> bool:
            # The server notices an exhausted message when it next tries to deliver it.
            with contextlib.suppress(nats.errors.TimeoutError):
                assert await subscription.fetch(1, timeout=0.2) == []
            info = await js.consumer_info(spec.stream, spec.durable)
            return info.num_ack_pending == 0 and info.num_pending == 0

        await eventually(given_up, what="the server gives up on the message")
    finally:
        await nc.close()


async def test_an_exhausted_prompt_nobody_heard_of_is_swept_into_a_dead_letter(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: ConfigFactory
) -> None:
    # Every puller was down when the server gave up on the prompt: nobody turned the advisory
    # into a dead letter, and the work queue would keep the prompt forever. The next plane to
    # pull from the queue finds it.
    config = data_plane_config_factory(nats_server.url, consumer={"max_deliver": 1})
    async with JetStreamPlane(config) as producer:
        names = producer.names
        ack = await producer.publish(names.prompts, b"forgotten", msg_id="forgotten")
    await _exhaust_without_a_plane(nats_server.url, names.prompt_consumer)
    async with JetStreamPlane(config) as worker:
        with capture_logs() as events:
            assert await worker.fetch(names.prompt_consumer, timeout_s=0.2) == []
        [letter] = await collect(worker, names.dead_letters)
        dead = read_dead_letter(letter)
        assert (dead.original_payload, dead.original_stream_seq) == (b"forgotten", ack.seq)
        assert dead.reason == "max_deliveries"
        states = {s.name: s for s in await worker.streams()}
        assert states[names.prompts_stream.name].messages == 0
        assert [e["messages"] for e in events if e["event"] == "dead_letter.swept"] == [1]
        assert await exhausted.sweep(worker, names.prompt_consumer) == 0  # nothing left


async def test_the_sweep_leaves_work_in_flight_alone(plane: JetStreamPlane) -> None:
    names = plane.names
    await _publish_numbered(plane, names.prompts, 3, "busy")
    first, second = await fetch_until(plane, names.prompt_consumer, 2)
    await first.nak(delay_s=30)  # waiting for a delayed redelivery
    # ``second`` is being worked on, the third is still to be delivered
    assert await exhausted.sweep(plane, names.prompt_consumer) == 0
    await second.ack()
    [third] = await fetch_until(plane, names.prompt_consumer, 1)
    await third.ack()
    assert await exhausted.sweep(plane, names.prompt_consumer) == 0  # the nak'ed one waits
    states = {s.name: s for s in await plane.streams()}
    assert states[names.prompts_stream.name].messages == 1
    assert await collect(plane, names.dead_letters) == []
    # History streams are never swept: their consumed messages stay by design.
    await plane.publish(names.rollouts, b"kept", msg_id="kept")
    [rollout] = await fetch_until(plane, names.rollout_consumer, 1)
    await rollout.ack()
    assert await exhausted.sweep(plane, names.rollout_consumer) == 0


async def test_a_failing_sweep_never_stops_the_puller(plane: JetStreamPlane, monkeypatch) -> None:
    # Stand-in for a sweep the broker refuses (it went away, or a credential lacks a right):
    # the role pulls on and the next sweep tries again.
    async def refused(plane, spec, **_) -> int:
        raise nats.errors.NoRespondersError

    monkeypatch.setattr(exhausted, "sweep", refused)  # the plane's channel opens at the fetch
    names = plane.names
    await plane.publish(names.prompts, b"work", msg_id="work")
    with capture_logs() as events:
        [delivery] = await fetch_until(plane, names.prompt_consumer, 1)
    assert delivery.data == b"work"
    assert [e["event"] for e in events if e["log_level"] == "warning"] == [
        "dead_letter.sweep_failed"
    ]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"not json", "unreadable publish ack"),
        (b'{"stream": "s", "seq": "7"}', "unreadable publish ack"),  # no coercion: seq is a str
        (b'{"error": {"description": "no code"}}', "unreadable publish ack"),
        (b'{"duplicate": true}', "publish ack without stream or seq"),
    ],
)
async def test_an_unreadable_pipelined_ack_fails_its_publish_with_the_reason(
    plane: JetStreamPlane, answer: bytes, why: str
) -> None:
    # A real responder (not a stream) answers a pipelined publish with what no server sends.
    # The publish must fail at once, saying why, so that its window falls back to the retrying
    # path; nats-py's handler let the parse error escape and left the ack waiting for the
    # window's whole timeout.
    async def respond(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(answer)

    responder = await plane.nc.subscribe("dockyard-test.not-a-stream", cb=respond)
    try:
        ack = await plane.js.publish_async("dockyard-test.not-a-stream", b"x")
        # A bound, not a measurement: the answer comes back within milliseconds.
        await asyncio.wait({ack}, timeout=30)
        assert ack.done(), "the ack future was left waiting"
        assert isinstance(ack.exception(), nats.errors.Error)
        assert why in str(ack.exception())
        assert plane.js.publish_async_pending() == 0  # its slot is given back
    finally:
        await responder.unsubscribe()
