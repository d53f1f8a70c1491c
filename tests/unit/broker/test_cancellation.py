"""A cancelled wait is cancelled, even when what it waited for arrives at the same moment.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that comes as the awaited thing
completes (it returns the result instead); a loop around it (a fetch that waits again until its
deadline) then never stops, and a role that is shut down keeps running. dockyard waits with
``asyncio.timeout`` instead, which keeps the cancellation.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from dockyard.broker.memory import MemoryPlane

PACKAGE = Path(__file__).resolve().parents[3] / "dockyard"


async def test_a_fetch_cancelled_as_a_message_arrives_is_cancelled():
    async with MemoryPlane() as plane:
        names = plane.names
        await plane.fetch(names.scored_consumer, timeout_s=0)  # the consumer exists
        for attempt in range(20):
            fetching = asyncio.ensure_future(plane.fetch(names.scored_consumer, timeout_s=30))
            await asyncio.sleep(0)  # let it start waiting
            await plane.publish(names.scored, b"x", msg_id=f"m{attempt}")  # wakes it...
            assert not fetching.done()
            fetching.cancel()  # ...and it is cancelled in the same turn of the loop
            with pytest.raises(asyncio.CancelledError):
                await fetching
            [left] = await plane.fetch(names.scored_consumer, timeout_s=0)  # not lost either
            await left.ack()


def test_the_package_never_waits_with_asyncio_wait_for():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(", line)
    ]
    assert offenders == [], "use `async with asyncio.timeout(...)` (see this module's docstring)"
