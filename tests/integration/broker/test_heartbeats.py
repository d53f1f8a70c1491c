"""Role heartbeats over the data plane (both implementations; JetStream on a real nats-server).

What a heartbeat must say comes from the issue (#26) and docs/operations.md: role, instance,
state, weight version, deliveries, failures, throughput, time; one record per instance, the
newest; a record that is not a heartbeat is shown with its reason, never dropped.
"""

from __future__ import annotations

import msgspec

from dockyard.broker.heartbeats import (
    HEARTBEAT_SCHEMA,
    BadHeartbeat,
    Heartbeat,
    HeartbeatPublisher,
    is_silent,
    publishing_heartbeats,
    read_heartbeats,
    subject_token,
)
from dockyard.broker.plane import DataPlane
from dockyard.broker.typed import MessagePlane
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import PromptGroup
from tests.integration.roles.factories import prompt_group


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_a_heartbeat_reports_the_roles_state_deliveries_and_rate(plane: DataPlane) -> None:
    worker = MessagePlane(plane, stage="rollout")
    status = StatusFile(None, "rollout", "node-1.example.org-42")
    clock = Clock(1000.0)
    publisher = HeartbeatPublisher(plane, status, worker, interval_s=5.0, clock=clock)
    status.update("running", detail="generating", weight_version=3, failures=1, groups=0)
    await publisher.beat()

    dispatcher = MessagePlane(plane, stage="trainer")
    await dispatcher.publish_many([prompt_group(f"g{i}") for i in range(4)])
    received = await worker.fetch(plane.names.prompt_consumer, PromptGroup, batch=4, timeout_s=5)
    assert len(received) == 4
    clock.now = 1002.0  # 4 deliveries in 2 s since the last beat
    await publisher.beat()

    records = await read_heartbeats(plane)
    assert len(records) == 1  # one record per instance: the newest replaced the first
    [beat] = records
    assert isinstance(beat, Heartbeat)
    assert (beat.schema, beat.role, beat.instance) == (
        HEARTBEAT_SCHEMA,
        "rollout",
        "node-1.example.org-42",
    )
    assert (beat.state, beat.detail, beat.weight_version) == ("running", "generating", 3)
    assert (beat.received, beat.published, beat.refused, beat.failures) == (4, 0, 0, 1)
    assert beat.received_per_s == 4 / 2.0
    assert beat.sent_at_unix_s == 1002.0 and beat.interval_s == 5.0
    assert beat.counters == {"failures": 1, "groups": 0}


async def test_the_last_beat_says_how_the_role_ended(plane: DataPlane) -> None:
    status = StatusFile(None, "scorer", "s0")
    async with publishing_heartbeats(plane, status, interval_s=3600.0):
        status.update("running")
        status.update("stopped")
    [beat] = await read_heartbeats(plane)
    assert isinstance(beat, Heartbeat) and beat.state == "stopped"


async def test_each_instance_has_its_record_and_a_bad_one_is_shown_with_its_reason(
    plane: DataPlane,
) -> None:
    for role, instance in (("trainer", "0"), ("scorer", "a.b"), ("scorer", "a_b")):
        await HeartbeatPublisher(plane, StatusFile(None, role, instance)).beat()
    forged = plane.names.heartbeat_subject("scorer", "forged")
    await plane.publish(forged, b'{"role": "scorer"}', msg_id="forged-1")

    records = await read_heartbeats(plane)
    beats = [(r.role, r.instance) for r in records if isinstance(r, Heartbeat)]
    # Two host names that differ only where a subject cannot hold them stay two instances.
    assert beats == [("scorer", "a.b"), ("scorer", "a_b"), ("trainer", "0")]
    [bad] = [r for r in records if isinstance(r, BadHeartbeat)]
    assert bad.subject == forged and "not a heartbeat" in bad.reason


def test_subject_tokens_are_single_tokens_and_distinct() -> None:
    tokens = {subject_token(name) for name in ("a.b", "a_b", "a b", "a*b", "a>b", "host-1")}
    assert len(tokens) == 6
    assert all("." not in t and "*" not in t and ">" not in t and " " not in t for t in tokens)
    assert subject_token("host-1") == "host-1"  # a safe id is kept as it is


def test_a_role_is_silent_after_three_missed_beats() -> None:
    beat = msgspec.convert(
        {
            "schema": HEARTBEAT_SCHEMA,
            "role": "rollout",
            "instance": "w",
            "host": "h",
            "pid": 1,
            "state": "running",
            "detail": "",
            "weight_version": None,
            "received": 0,
            "published": 0,
            "refused": 0,
            "failures": 0,
            "received_per_s": None,
            "interval_s": 5.0,
            "sent_at_unix_s": 100.0,
            "counters": {},
        },
        Heartbeat,
    )
    assert not is_silent(beat, 100.0 + 15.0)
    assert is_silent(beat, 100.0 + 15.1)


async def test_the_heartbeats_stream_reserves_little(data_plane_config) -> None:  # type: ignore[no-untyped-def]
    # JetStream reserves a file stream's max_bytes up front: the data streams' limit (256 MiB
    # in the test config, 8 GiB by default) is capped to 64 MiB for a stream of small records.
    from dockyard.broker.jetstream import JetStreamPlane

    async with JetStreamPlane(data_plane_config) as plane:
        info = await plane.js.stream_info(plane.names.heartbeats_stream.name)
        assert info.config.max_bytes == 64 * 1024 * 1024
        assert info.config.max_msgs_per_subject == 1 and info.config.max_age == 3600


def test_a_byte_cap_only_lowers_the_configured_limit() -> None:
    from dockyard.broker.names import PlaneNames

    spec = PlaneNames("ns").heartbeats_stream
    cap = 64 * 1024 * 1024
    assert spec.effective_max_bytes(-1) == cap  # "no limit" configured: the cap
    assert spec.effective_max_bytes(8 * 1024**3) == cap
    assert spec.effective_max_bytes(1024) == 1024
    assert PlaneNames("ns").experience_stream.effective_max_bytes(-1) == -1  # no cap
