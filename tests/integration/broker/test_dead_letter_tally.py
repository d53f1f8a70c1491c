"""Dead letters counted by stage and reason as the stream grows (``dockyard status``, the
dashboard's refreshes): read on from the last count, only the newest ``limit``, and the same
counts as a count made from scratch."""

from __future__ import annotations

from datetime import UTC, datetime

from dockyard.broker.plane import DataPlane, StoredMessage
from dockyard.fleet.overview import DeadLetterCount, DeadLetterTally


async def _refuse(plane: DataPlane, *refusals: tuple[str, str]) -> None:
    for stage, reason in refusals:
        seq = _refuse.count = getattr(_refuse, "count", 0) + 1  # type: ignore[attr-defined]
        original = StoredMessage("s", "x.y", seq, datetime.now(UTC), {}, b"bad %d" % seq)
        await plane.publish_dead_letter(original, reason, "detail", stage=stage)


async def _dead_stream(plane: DataPlane):  # type: ignore[no-untyped-def]
    name = plane.names.dead_letters_stream.name
    return next(s for s in await plane.streams() if s.name == name)


async def test_the_tally_reads_on_and_keeps_the_newest(plane: DataPlane) -> None:
    tally = DeadLetterTally(limit=4)
    await _refuse(plane, ("scorer", "env_error"), ("scorer", "env_error"), ("rollout", "x"))
    await tally.update(plane, await _dead_stream(plane))
    assert tally.counted == 3
    assert tally.counts() == [
        DeadLetterCount("scorer", "env_error", 2),
        DeadLetterCount("rollout", "x", 1),
    ]

    await _refuse(plane, ("trainer", "stale"), ("trainer", "stale"))
    stream = await _dead_stream(plane)
    await tally.update(plane, stream)
    # Five stored, the newest four counted: the first env_error fell out of the window.
    expected = [
        DeadLetterCount("trainer", "stale", 2),
        DeadLetterCount("rollout", "x", 1),
        DeadLetterCount("scorer", "env_error", 1),
    ]
    assert (tally.counted, tally.counts()) == (4, expected)
    fresh = DeadLetterTally(limit=4)
    await fresh.update(plane, stream)
    assert (fresh.counted, fresh.counts()) == (4, expected)
