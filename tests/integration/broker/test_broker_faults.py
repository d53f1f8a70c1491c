"""Reliability against a real nats-server that the tests kill and restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable

import nats
import pytest
from broker_test_utils import SecuredBroker, collect, eventually, fetch_until
from nats.aio.msg import Msg
from nats.js import api
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from dockyard.broker.connection import ConnectError
from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import (
    REASON_MAX_DELIVERIES,
    OutgoingMessage,
    PermissionDenied,
    PublishError,
)
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.config.sections.data_plane import DataPlaneConfig

ConfigFactory = Callable[..., DataPlaneConfig]
MiB = 1024 * 1024


@pytest.mark.slow
async def test_broker_sigkill_and_restart_loses_nothing_and_processes_once(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    server = nats_server_factory()
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        consumer={"ack_wait_s": 2.0, "max_deliver": 100},
        publish={"timeout_s": 1.0, "retries": 20},
    )
    total = 300
    processed: set[str] = set()
    deliveries_seen = 0
    published = 0

    async with JetStreamPlane(config) as producer, JetStreamPlane(config) as consumer:
        names = producer.names

        async def produce() -> None:
            nonlocal published
            for i in range(total):
                await producer.publish(names.rollouts, f"m{i}".encode(), msg_id=f"m{i}")
                published += 1

        async def consume() -> None:
            nonlocal deliveries_seen
            deadline = time.monotonic() + 60
            while len(processed) < total and time.monotonic() < deadline:
                for delivery in await consumer.fetch(names.rollout_consumer, 32, 0.5):
                    deliveries_seen += 1
                    assert delivery.msg_id is not None
                    processed.add(delivery.msg_id)  # idempotent: a redelivery adds nothing
                    await delivery.ack()

        tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
        await eventually(
            lambda: _value(published >= total // 3 and len(processed) >= total // 4),
            what="a third published and a quarter consumed",
        )
        server.kill()  # type: ignore[attr-defined]
        await asyncio.to_thread(server.restart)  # type: ignore[attr-defined]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=90)
        # both sides really lost the broker and came back by themselves
        assert producer.reconnects >= 1 and consumer.reconnects >= 1

    assert processed == {f"m{i}" for i in range(total)}
    assert deliveries_seen >= total


async def _value(value: bool) -> bool:
    return value


@pytest.mark.slow
async def test_an_ordered_consumer_reset_after_a_restart_keeps_its_own_deliveries(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    # The restarted server has lost the ordered consumer, so its heartbeats stop and nats-py
    # resets it onto a new subscription id taken from the client's counter. That id must not
    # be handed out again: a later subscription on it took over the ordered consumer's
    # deliveries (the weight watch and blob reads of issue #17).
    server = nats_server_factory()
    config = data_plane_config_factory(server.url)  # type: ignore[attr-defined]
    async with JetStreamPlane(config) as plane:
        names = plane.names
        watched: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_event(msg: Msg) -> None:
            watched.put_nowait(msg.data)

        # nats-py's own ordered consumer (dockyard's roles create none: they follow subjects by
        # direct get), with a short heartbeat so the reset comes quickly.
        await plane.js.subscribe(
            names.weight_events,
            stream=names.stream_for_subject(names.weight_events).name,
            cb=on_event,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
            idle_heartbeat=1.0,
        )
        await plane.publish(names.weight_events, b"before", msg_id="before")
        assert await asyncio.wait_for(watched.get(), 10) == b"before"

        server.kill()  # type: ignore[attr-defined]
        await asyncio.to_thread(server.restart)  # type: ignore[attr-defined]
        await eventually(lambda: _value(plane.reconnects >= 1), what="the reconnect")
        await plane.publish(names.weight_events, b"after", msg_id="after")
        # Only a reset consumer delivers this one: the restarted server has no other.
        assert await asyncio.wait_for(watched.get(), 30) == b"after"

        # New subscriptions after the reset: the pull channel's inbox and its advisory watch.
        assert await plane.fetch(names.rollout_consumer, 1, timeout_s=0.1) == []
        await plane.publish(names.weight_events, b"event", msg_id="event")
        await plane.publish(names.rollouts, b"rollout", msg_id="rollout")
        assert await asyncio.wait_for(watched.get(), 10) == b"event"
        fetched = await fetch_until(plane, names.rollout_consumer, 1)
        assert [delivery.data for delivery in fetched] == [b"rollout"]
        assert watched.empty()


@pytest.mark.slow
async def test_messages_held_by_a_dead_consumer_are_redelivered_then_dead_lettered(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    server = nats_server_factory()
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        consumer={"ack_wait_s": 1.0, "max_deliver": 2},
    )
    async with JetStreamPlane(config) as survivor:
        names = survivor.names
        for i in range(3):
            await survivor.publish(names.rollouts, f"held{i}".encode(), msg_id=f"held{i}")
        doomed = JetStreamPlane(config)
        await doomed.start()
        held = await fetch_until(doomed, names.rollout_consumer, 3)
        assert [d.num_delivered for d in held] == [1, 1, 1]
        await doomed.close()  # dies without acking

        redelivered = await fetch_until(survivor, names.rollout_consumer, 3, timeout_s=10)
        assert sorted(d.data for d in redelivered) == [b"held0", b"held1", b"held2"]
        assert all(d.num_delivered == 2 for d in redelivered)
        # the survivor fails them too; after max_deliver they become dead letters

        async def dead_letters() -> list[object]:
            await survivor.fetch(names.rollout_consumer, timeout_s=0.2)
            return await collect(survivor, names.dead_letters)

        dead = await eventually(
            lambda: _at_least(dead_letters(), 3), what="three dead letters", timeout_s=15
        )
        letters = [read_dead_letter(d) for d in dead]  # type: ignore[arg-type]
        assert {letter.reason for letter in letters} == {REASON_MAX_DELIVERIES}
        assert sorted(letter.original_payload for letter in letters) == [  # type: ignore[type-var]
            b"held0",
            b"held1",
            b"held2",
        ]
        assert all(letter.delivery_count == 2 for letter in letters)


async def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` in state T (stopped), from /proc."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as stat:
            states.append(stat.read().rsplit(")", 1)[1].split()[0])
    return all(state == "T" for state in states)


async def _at_least(items: object, count: int) -> object:
    values = await items  # type: ignore[misc]
    return values if len(values) >= count else None


@pytest.mark.slow
@pytest.mark.parametrize("request_kind", ["publish", "pipelined", "read"])
async def test_a_request_lost_with_a_killed_broker_is_retried_once_it_is_back(
    nats_server_factory: Callable[..., object],
    data_plane_config_factory: ConfigFactory,
    request_kind: str,
) -> None:
    # A request that went out just before the broker died is never answered. It used to wait
    # for its whole timeout (10 s by default) before the retry: after a restart every role
    # stalled that long on whatever it had in flight.
    server = nats_server_factory()
    timeout_s = 30.0
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        publish={"timeout_s": timeout_s, "retries": 2},
    )
    async with JetStreamPlane(config) as plane:
        subject = plane.names.weight_events
        await plane.publish(subject, b"v1", msg_id="v1")
        requests = {
            "publish": lambda: plane.publish(subject, b"v2", msg_id="v2"),
            "pipelined": lambda: plane.publish_many([OutgoingMessage(subject, b"v2", "v2", {})]),
            "read": lambda: plane.latest(subject),
        }
        os.kill(server.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
        try:
            # A stop is delivered thread by thread: until every thread of the server is stopped
            # it may still answer (seen on a loaded machine, the request acked).
            await eventually(lambda: _all_threads_stopped(server.pid), what="the server stopped")  # type: ignore[attr-defined]
            sent_before = plane.nc.stats["out_msgs"]
            request = asyncio.ensure_future(requests[request_kind]())

            async def handed_to_the_socket() -> bool:  # never to be answered by this process
                return plane.nc.stats["out_msgs"] > sent_before and not plane.nc.pending_data_size

            await eventually(handed_to_the_socket, what="the request sent")
            # (what it ended with, if it did: seen once under a full suite, not reproduced)
            assert not request.done(), (
                request.exception() if not request.cancelled() else "cancelled"
            ) or request.result()
        finally:
            server.kill()  # type: ignore[attr-defined]
        started = time.monotonic()
        await asyncio.to_thread(server.restart)  # type: ignore[attr-defined]
        answer = await asyncio.wait_for(request, timeout_s / 3)
        assert time.monotonic() - started < timeout_s / 3
    if request_kind == "read":
        assert answer is not None and answer.data == b"v1"  # type: ignore[union-attr]


@pytest.mark.slow
async def test_a_read_while_the_broker_restarts_returns_once_it_is_back(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    # The trainer reads the blob manifest of every weight version it publishes; such a read
    # during a broker restart raised nats' TimeoutError and killed the trainer.
    server = nats_server_factory()
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        publish={"timeout_s": 0.5, "retries": 40},
    )
    async with JetStreamPlane(config) as plane:
        subject = plane.names.weight_events
        await plane.publish(subject, b"v1", msg_id="v1")
        server.kill()  # type: ignore[attr-defined]
        with capture_logs() as events:
            reading = asyncio.ensure_future(plane.latest(subject))
            # The read outlives its first timeout while the broker is away...
            await eventually(
                lambda: _value(any(e["event"] == "read.retry" for e in events) or reading.done()),
                what="a retried read",
            )
            assert not reading.done()
            await asyncio.to_thread(server.restart)  # type: ignore[attr-defined]
            # ...and returns what the restarted broker still holds.
            latest = await asyncio.wait_for(reading, 30)
        assert latest is not None and latest.data == b"v1"


@pytest.mark.parametrize("settle", ["ack", "nak", "term", "in_progress"])
async def test_a_settle_that_cannot_reach_the_broker_is_logged_and_the_message_comes_back(
    nats_server_factory: Callable[..., object],
    data_plane_config_factory: ConfigFactory,
    settle: str,
) -> None:
    # Issue #17: a scorer whose ack met a closed connection died of ConnectionClosedError.
    server = nats_server_factory()
    config = data_plane_config_factory(server.url)  # type: ignore[attr-defined]
    async with JetStreamPlane(config) as survivor:
        names = survivor.names
        await survivor.publish(names.rollouts, b"work", msg_id="work")
        async with JetStreamPlane(config) as closing:
            (delivery,) = await fetch_until(closing, names.rollout_consumer, 1)
            await closing.nc.close()  # gone between the delivery and its settle
            with capture_logs() as events:
                await getattr(delivery, settle)()
        warnings = [e for e in events if e["event"] == "settle.unreachable"]
        assert [(w["settle"], w["subject"], w["seq"]) for w in warnings] == [
            (settle, names.rollouts, delivery.seq)
        ]
        assert "ConnectionClosedError" in warnings[0]["error"]
        # The broker never heard of the settle: the message comes back after the ack wait.
        (again,) = await fetch_until(survivor, names.rollout_consumer, 1)
        assert (again.data, again.num_delivered) == (b"work", 2)


async def test_publishing_while_the_broker_is_down_fails_clearly_with_bounded_buffer(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    server = nats_server_factory()
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        publish={"timeout_s": 0.5, "retries": 1, "max_buffered_bytes": 4 * MiB},
    )
    async with JetStreamPlane(config) as plane:
        names = plane.names
        await plane.publish(names.rollouts, b"before", msg_id="before")
        server.kill()  # type: ignore[attr-defined]
        started = time.monotonic()
        with pytest.raises(PublishError, match="failed after 2 attempts"):
            await plane.publish(names.rollouts, b"x" * 1024, msg_id="during")
        assert time.monotonic() - started < 5
        # a burst bigger than the outbound buffer is refused, not buffered without limit
        refusals: list[str] = []
        for i in range(6):
            try:
                await plane.publish(names.rollouts, os.urandom(MiB), msg_id=f"burst{i}")
            except PublishError as error:
                refusals.append(str(error))
        assert len(refusals) == 6
        assert any("outbound buffer is full" in refusal for refusal in refusals)
        assert plane.nc.pending_data_size <= 4 * MiB


async def _all_stored_once(
    plane: JetStreamPlane, subject_consumer: object, count: int, prefix: str = "m"
) -> None:
    seen: list[str] = []
    while len(seen) < count:
        deliveries = await plane.fetch(subject_consumer, 64, 2.0)  # type: ignore[arg-type]
        assert deliveries, f"only {len(seen)} of {count} messages were stored"
        for delivery in deliveries:
            assert delivery.msg_id is not None
            seen.append(delivery.msg_id)
            await delivery.ack()
    assert sorted(seen) == sorted(f"{prefix}{i}" for i in range(count))  # each once, none lost
    assert not await plane.fetch(subject_consumer, 64, 0.2)  # type: ignore[arg-type]


async def test_a_refused_publish_is_retried_at_once_and_lands_once(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    # A scripted responder stands in for the stream on one subject, because whether a real
    # server refuses (429 "too many requests": its per-stream ingest buffer is full) depends on
    # timing. It answers as JetStream does: a 429 for a message's first two publishes (the
    # pipelined one and the first awaited one), then an ack. The replies travel through the real
    # server to the plane's real nats-py client.
    server = nats_server_factory()
    url = server.url  # type: ignore[attr-defined]
    config = data_plane_config_factory(url, publish={"timeout_s": 30.0, "retries": 3})
    attempts: Counter[str] = Counter()
    refusal = {"error": {"code": 429, "err_code": 10167, "description": "too many requests"}}

    async def respond(msg: Msg) -> None:
        msg_id = (msg.headers or {})["Nats-Msg-Id"]
        attempts[msg_id] += 1
        reply = refusal if attempts[msg_id] <= 2 else {"stream": "S", "seq": int(msg_id[1:])}
        await responder.publish(msg.reply, json.dumps(reply).encode())

    responder = await nats.connect(url)
    try:
        await responder.subscribe("scripted.experience", cb=respond)
        await responder.flush()
        async with JetStreamPlane(config) as plane:
            messages = [
                OutgoingMessage("scripted.experience", b"x" * 1024, f"m{i}", {})
                for i in range(1, 9)
            ]
            started = time.monotonic()
            retries_before = REGISTRY.get_sample_value("dockyard_publish_retries_total")
            with capture_logs() as logs:
                acks = await plane.publish_many(messages)
            retries = REGISTRY.get_sample_value("dockyard_publish_retries_total") - retries_before
            # Noticed when the refusal arrives, not when the 30 s ack timeout runs out.
            assert time.monotonic() - started < 15
    finally:
        await responder.close()
    assert [ack.seq for ack in acks] == list(range(1, 9))
    assert attempts == Counter({f"m{i}": 3 for i in range(1, 9)})
    events = [entry["event"] for entry in logs]
    assert events.count("publish_async.fallback") == 1  # one line per window
    assert events.count("publish.retry") == 8
    # Each message was sent three times: two retries each (the window's and the awaited one's).
    assert retries == 2 * 8
    assert all("429" in entry["error"] for entry in logs if entry["event"].startswith("publish"))


async def test_publishes_a_real_server_refuses_as_too_many_land_once(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    # An ingest buffer of 2 messages (the default is 10,000) and a 16 MiB window of 256 KiB
    # messages: the server usually refuses part of the window with 429 and drops those (how
    # much depends on timing, so this test asserts only the outcome).
    server = nats_server_factory(max_buffered_msgs=2)
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        publish={"timeout_s": 30.0, "retries": 8, "window": 64, "window_bytes": 64 * MiB},
    )
    async with JetStreamPlane(config) as plane:
        names = plane.names
        messages = [
            OutgoingMessage(names.scored, os.urandom(256 * 1024), f"m{i}", {}) for i in range(64)
        ]
        started = time.monotonic()
        acks = await plane.publish_many(messages)
        assert time.monotonic() - started < 15
        assert len({ack.seq for ack in acks}) == 64
        await _all_stored_once(plane, names.scored_consumer, 64)


async def test_the_publish_window_is_bounded_in_bytes(
    nats_server_factory: Callable[..., object], data_plane_config_factory: ConfigFactory
) -> None:
    # Windows of at most 1 MiB never overflow a 2 MiB ingest buffer: no refusal at all.
    server = nats_server_factory(max_buffered_size=2 * MiB)
    config = data_plane_config_factory(
        server.url,  # type: ignore[attr-defined]
        publish={"timeout_s": 30.0, "window": 64, "window_bytes": MiB},
    )
    async with JetStreamPlane(config) as plane:
        names = plane.names
        messages = [
            OutgoingMessage(names.scored, os.urandom(256 * 1024), f"m{i}", {}) for i in range(64)
        ]
        with capture_logs() as logs:
            acks = await plane.publish_many(messages)
        assert [entry for entry in logs if entry["event"].startswith("publish")] == []
        assert [ack.seq for ack in acks] == sorted(ack.seq for ack in acks)  # order kept
        await _all_stored_once(plane, names.scored_consumer, 64)


async def test_a_rollout_credential_cannot_publish_a_weight_event(
    secured_broker: SecuredBroker,
) -> None:
    role_config = secured_broker.config
    async with JetStreamPlane(role_config("rollout")) as rollout:
        names = rollout.names
        ack = await rollout.publish(names.rollouts, b"a rollout", msg_id="ok")
        assert ack.seq == 1
        started = time.monotonic()
        with pytest.raises(PermissionDenied, match=r"secured\.weights\.events"):
            await rollout.publish(names.weight_events, b"forged version", msg_id="forged")
        assert time.monotonic() - started < 2.0  # surfaced at once, not as a 5 s timeout
    async with JetStreamPlane(role_config("trainer")) as trainer:
        await trainer.publish(trainer.names.weight_events, b"real version", msg_id="v1")
        assert [m.data for m in await collect(trainer, names.weight_events)] == [b"real version"]
        blob = await create_weight_store(trainer).put(1, b"weights" * 100)
    async with JetStreamPlane(role_config("rollout")) as rollout:
        # A worker reads blobs under a lease (its own records) but cannot write blob data.
        worker_store = create_weight_store(rollout, reader_id="worker-1")
        assert await worker_store.get_bytes(blob) == b"weights" * 100
        with pytest.raises(PermissionDenied, match=r"secured\.blobs\."):
            await rollout.publish(names.blob_data_subject(blob.hex), b"evil", msg_id="evil")
    async with JetStreamPlane(role_config("trainer")) as trainer:
        # A role without lease permission still reads (under the grace period only).
        reader = create_weight_store(trainer, reader_id="no-lease-role")
        assert await reader.get_bytes(blob) == b"weights" * 100
        readers = {
            m.subject.rsplit(".", 1)[1] async for m in trainer.replay(names.leases_of(blob.hex))
        }
        assert readers == {"worker-1"}  # the refused lease was never written

    wrong = role_config("rollout").model_copy(deep=True)
    wrong.credentials.password = "not-the-password"
    with pytest.raises(ConnectError, match=r"refused user 'rollout'.*Authorization Violation"):
        async with JetStreamPlane(wrong):
            pass
