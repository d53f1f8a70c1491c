"""The in-memory plane applies the streams' age limit like JetStream (the clock is moved, not
waited for)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dockyard.broker import memory
from dockyard.broker.memory import MemoryPlane
from dockyard.config.sections.data_plane import DataPlaneConfig


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def _data(plane: MemoryPlane, subject: str) -> list[bytes]:
    return [m.data async for m in plane.replay(subject)]


async def test_messages_older_than_max_age_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(memory, "_now", clock)
    async with MemoryPlane(DataPlaneConfig(namespace="aged", streams={"max_age_s": 60})) as plane:
        names = plane.names
        await plane.publish(names.scored, b"old", msg_id="old")
        clock.now += timedelta(seconds=59)
        await plane.publish(names.scored, b"recent", msg_id="recent")
        assert await _data(plane, names.scored) == [b"old", b"recent"]
        clock.now += timedelta(seconds=2)  # "old" is now 61 s old
        await plane.publish(names.scored, b"new", msg_id="new")
        assert await _data(plane, names.scored) == [b"recent", b"new"]


async def test_a_streams_own_age_limit_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(memory, "_now", clock)
    async with MemoryPlane(DataPlaneConfig(namespace="leases")) as plane:  # no global limit
        names = plane.names
        await plane.publish(names.lease_subject("aa", "w1"), b"lease", msg_id="l1")
        await plane.publish(names.scored, b"kept", msg_id="s1")
        clock.now += timedelta(days=2)  # beyond the leases stream's own 24 h
        await plane.publish(names.lease_subject("bb", "w1"), b"lease", msg_id="l2")
        await plane.publish(names.scored, b"kept too", msg_id="s2")
        assert await _data(plane, names.leases_of("aa")) == []
        assert await _data(plane, names.leases_of("bb")) == [b"lease"]
        assert await _data(plane, names.scored) == [b"kept", b"kept too"]
