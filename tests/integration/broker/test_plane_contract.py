"""One contract, two planes: every test runs against the in-memory and the JetStream plane."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from broker_test_utils import collect, eventually, fetch_until

from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.plane import (
    HEADER_DEAD_DETAIL,
    HEADER_DEAD_REASON,
    HEADER_ORIGINAL_SEQ,
    HEADER_ORIGINAL_SUBJECT,
    REASON_MAX_DELIVERIES,
    AlreadySettled,
    DataPlane,
    OutgoingMessage,
)


async def test_publish_fetch_ack_roundtrip(plane: DataPlane) -> None:
    names = plane.names
    ack = await plane.publish(names.rollouts, b"payload-1", msg_id="r1", headers={"X-Kind": "a"})
    assert not ack.duplicate and ack.seq >= 1
    [delivery] = await fetch_until(plane, names.rollout_consumer, 1)
    assert delivery.data == b"payload-1"
    assert delivery.subject == names.rollouts
    assert delivery.headers["X-Kind"] == "a"
    assert delivery.msg_id == "r1"
    assert delivery.seq == ack.seq
    assert delivery.num_delivered == 1
    assert delivery.timestamp.tzinfo is not None
    await delivery.ack()
    assert await plane.fetch(names.rollout_consumer, timeout_s=0.2) == []


async def test_duplicate_msg_id_is_stored_once(plane: DataPlane) -> None:
    names = plane.names
    first = await plane.publish(names.scored, b"x", msg_id="same")
    second = await plane.publish(names.scored, b"x", msg_id="same")
    assert second.duplicate and second.seq == first.seq
    [delivery] = await fetch_until(plane, names.scored_consumer, 1)
    await delivery.ack()
    assert await plane.fetch(names.scored_consumer, timeout_s=0.3) == []


async def test_consumers_on_one_stream_filter_by_subject(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.rollouts, b"raw", msg_id="raw")
    await plane.publish(names.scored, b"scored", msg_id="scored")
    [raw] = await fetch_until(plane, names.rollout_consumer, 1)
    [scored] = await fetch_until(plane, names.scored_consumer, 1)
    assert (raw.data, scored.data) == (b"raw", b"scored")


async def test_unacked_message_is_redelivered_after_ack_wait(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.rollouts, b"slow", msg_id="slow")
    [first] = await fetch_until(plane, names.rollout_consumer, 1)
    [again] = await fetch_until(plane, names.rollout_consumer, 1, timeout_s=5)
    assert again.seq == first.seq and again.num_delivered == 2
    await again.ack()


async def test_nak_redelivers_and_term_does_not(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.rollouts, b"a", msg_id="a")
    await plane.publish(names.rollouts, b"b", msg_id="b")
    first, second = await fetch_until(plane, names.rollout_consumer, 2)
    await first.nak()
    await second.term("bad")
    [redelivered] = await fetch_until(plane, names.rollout_consumer, 1)
    assert redelivered.data == first.data and redelivered.num_delivered == 2
    await redelivered.ack()
    # the termed message never comes back, even after ack_wait
    assert await fetch_until(plane, names.rollout_consumer, 1, timeout_s=1.5) == []


async def test_a_delivery_is_settled_once(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.rollouts, b"once", msg_id="once")
    [delivery] = await fetch_until(plane, names.rollout_consumer, 1)
    assert not delivery.settled
    await delivery.ack()
    assert delivery.settled
    await delivery.in_progress()  # nothing left to extend: not an error
    for settle in (delivery.ack, delivery.nak, delivery.term):
        with pytest.raises(AlreadySettled, match="already settled"):
            await settle()
    assert await fetch_until(plane, names.rollout_consumer, 1, timeout_s=1.5) == []


async def test_in_progress_extends_the_ack_deadline(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.rollouts, b"long", msg_id="long")
    [delivery] = await fetch_until(plane, names.rollout_consumer, 1)
    for _ in range(3):  # 3 × 0.5 s > ack_wait of 1 s, but the timer keeps being reset
        await delivery.in_progress()
        assert await plane.fetch(names.rollout_consumer, timeout_s=0.5) == []
    await delivery.ack()


async def test_max_deliveries_become_dead_letters(plane: DataPlane) -> None:
    names = plane.names
    max_deliver = plane.config.consumer.max_deliver
    ack = await plane.publish(names.rollouts, b"cursed", msg_id="cursed")
    for attempt in range(1, max_deliver + 1):
        [delivery] = await fetch_until(plane, names.rollout_consumer, 1)
        assert delivery.num_delivered == attempt
        await delivery.nak()
    # a further fetch finds nothing and the message lands in dead letters with its reason
    assert await plane.fetch(names.rollout_consumer, timeout_s=0.3) == []
    dead = await eventually(
        lambda: collect(plane, names.dead_letters), what="dead letter", timeout_s=10
    )
    assert len(dead) == 1
    letter = read_dead_letter(dead[0])
    assert letter.original_payload == b"cursed"
    assert letter.reason == REASON_MAX_DELIVERIES
    assert letter.original_stream_seq == ack.seq
    assert dead[0].headers[HEADER_DEAD_REASON] == REASON_MAX_DELIVERIES
    assert dead[0].headers[HEADER_ORIGINAL_SEQ] == str(ack.seq)
    assert dead[0].headers[HEADER_ORIGINAL_SUBJECT] == names.rollouts


async def test_explicit_dead_letter_terms_the_original(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.scored, b"\x00garbage", msg_id="garbage")
    [delivery] = await fetch_until(plane, names.scored_consumer, 1)
    await plane.dead_letter(delivery, "undecodable", "bad\nframe header")
    [dead] = await collect(plane, names.dead_letters)
    assert dead.headers[HEADER_DEAD_REASON] == "undecodable"
    assert dead.headers[HEADER_DEAD_DETAIL] == "bad frame header"  # one line
    letter = read_dead_letter(dead)
    assert letter.original_payload == b"\x00garbage"
    assert (letter.reason, letter.message, letter.delivery_count) == (
        "undecodable",
        "bad\nframe header",
        1,
    )
    assert await fetch_until(plane, names.scored_consumer, 1, timeout_s=1.5) == []


async def test_prompts_are_a_work_queue_and_experience_is_kept(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.prompts, b"p", msg_id="p")
    await plane.publish(names.scored, b"s", msg_id="s")
    for consumer in (names.prompt_consumer, names.scored_consumer):
        [delivery] = await fetch_until(plane, consumer, 1)
        await delivery.ack()

    async def prompts_emptied() -> bool:
        states = {s.name: s for s in await plane.streams()}
        return states[names.prompts_stream.name].messages == 0

    await eventually(prompts_emptied, what="acked prompt removed from the work queue")
    assert [m.data for m in await collect(plane, names.scored)] == [b"s"]


async def test_replay_by_sequence_time_and_limit(plane: DataPlane) -> None:
    names = plane.names
    acks = [await plane.publish(names.scored, f"m{i}".encode(), msg_id=f"m{i}") for i in range(5)]
    await plane.publish(names.rollouts, b"other-subject", msg_id="other")
    everything = await collect(plane, names.scored)
    assert [m.data for m in everything] == [f"m{i}".encode() for i in range(5)]
    from_third = await collect(plane, names.scored, from_seq=acks[2].seq)
    assert [m.data for m in from_third] == [b"m2", b"m3", b"m4"]
    assert [m.data for m in await collect(plane, names.scored, limit=2)] == [b"m0", b"m1"]
    cutoff = datetime.now(UTC)
    await plane.publish(names.scored, b"late", msg_id="late")
    since = await collect(plane, names.scored, since=cutoff)
    assert [m.data for m in since] == [b"late"]
    assert (await plane.get(names.experience_stream.name, acks[1].seq)).data == b"m1"
    with pytest.raises(KeyError):
        await plane.get(names.experience_stream.name, 10_000)


async def test_purge_drops_one_subjects_messages_only(plane: DataPlane) -> None:
    names = plane.names
    for reader in ("w1", "w2"):
        await plane.publish(names.lease_subject("aa", reader), b"lease", msg_id=f"aa{reader}")
    await plane.publish(names.lease_subject("bb", "w1"), b"kept", msg_id="bbw1")
    await plane.purge(names.leases_of("aa"))
    assert [m.data for m in await collect(plane, names.leases_of("aa"))] == []
    assert [m.data for m in await collect(plane, names.leases_of("bb"))] == [b"kept"]
    await plane.purge(names.leases_of("never-written"))  # nothing to purge is not an error


async def test_a_per_subject_limit_keeps_the_newest_message(plane: DataPlane) -> None:
    names = plane.names
    subject = names.lease_subject("cc", "w1")
    for i in range(3):
        await plane.publish(subject, f"record {i}".encode(), msg_id=f"cc{i}")
    assert [m.data for m in await collect(plane, subject)] == [b"record 2"]


async def test_latest_and_watch_follow_weight_events(plane: DataPlane) -> None:
    names = plane.names
    assert await plane.current_weight_event() is None
    await plane.publish(names.weight_events, b"v1", msg_id="v1")
    await plane.publish(names.weight_events, b"v2", msg_id="v2")
    current = await plane.current_weight_event()
    assert current is not None and current.data == b"v2"

    seen: list[bytes] = []

    async def follow() -> None:
        async for event in plane.watch(names.weight_events):
            seen.append(event.data)
            if event.data == b"v3":
                return

    watcher = asyncio.create_task(follow())
    await eventually(lambda: _async_value(seen == [b"v2"]), what="latest event seen first")
    await plane.publish(names.weight_events, b"v3", msg_id="v3")
    await asyncio.wait_for(watcher, timeout=10)
    assert seen == [b"v2", b"v3"]


async def test_only_announcing_streams_can_be_followed(plane: DataPlane) -> None:
    # Weight events and leases are announced and followed; the experience stream is read by
    # consumers (announcing each group would double the server's messages), so a watch on it
    # is refused at once rather than waiting for announcements that never come.
    names = plane.names
    assert names.weights_stream.announces and names.leases_stream.announces
    assert not names.experience_stream.announces and not names.prompts_stream.announces
    with pytest.raises(ValueError, match="cannot be followed"):
        await anext(plane.watch(names.scored))


async def _async_value(value: bool) -> bool:
    return value


async def test_consumer_lag_counts_pending_and_unacked(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish_many(
        [OutgoingMessage(names.rollouts, f"{i}".encode(), f"lag{i}") for i in range(6)]
    )
    lag = await plane.consumer_lag(names.rollout_consumer)
    assert (lag.pending, lag.ack_pending) == (6, 0)
    fetched = await fetch_until(plane, names.rollout_consumer, 2)
    lag = await plane.consumer_lag(names.rollout_consumer)
    assert (lag.pending, lag.ack_pending, lag.backlog) == (4, 2, 6)
    for delivery in fetched:
        await delivery.ack()

    async def acks_counted() -> bool:  # acks are asynchronous on JetStream
        return (await plane.consumer_lag(names.rollout_consumer)).backlog == 4

    await eventually(acks_counted, what="backlog of 4 after two acks")


async def test_publish_many_keeps_order_and_dedupes(plane: DataPlane) -> None:
    names = plane.names
    messages = [OutgoingMessage(names.scored, f"{i}".encode(), f"pm{i}") for i in range(200)]
    acks = await plane.publish_many(messages)
    assert [a.seq for a in acks] == sorted(a.seq for a in acks)
    again = await plane.publish_many(messages[:10])
    assert all(a.duplicate for a in again)
    assert len(await collect(plane, names.scored)) == 200


async def test_a_pool_sharing_one_durable_splits_the_work(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish_many(
        [OutgoingMessage(names.rollouts, f"{i}".encode(), f"pool{i}") for i in range(20)]
    )
    seen: list[bytes] = []

    async def member() -> None:
        while True:
            batch = await plane.fetch(names.rollout_consumer, batch=3, timeout_s=0.3)
            if not batch:
                return
            for delivery in batch:
                seen.append(delivery.data)
                await delivery.ack()

    await asyncio.gather(member(), member())
    assert sorted(seen) == sorted(f"{i}".encode() for i in range(20))


async def test_provisioning_is_idempotent(plane: DataPlane) -> None:
    report = await plane.provision()
    assert report.created == () and report.updated == ()
    assert len(report.unchanged) == len(plane.names.all_streams()) + len(plane.names.consumers())


async def test_streams_report_ranges_and_consumers(plane: DataPlane) -> None:
    names = plane.names
    await plane.publish(names.rollouts, b"12345", msg_id="one")
    states = {s.name: s for s in await plane.streams()}
    experience = states[names.experience_stream.name]
    assert (experience.messages, experience.first_seq, experience.last_seq) == (1, 1, 1)
    assert experience.bytes >= 5
    consumers = {c.durable: c for c in experience.consumers}
    assert consumers[names.rollout_consumer.durable].pending == 1
    assert consumers[names.scored_consumer.durable].pending == 0
