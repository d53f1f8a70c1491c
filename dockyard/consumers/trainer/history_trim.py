"""Trimming the experience stream's history when it fills (the policy: ``broker/stream_room``).

The experience stream refuses new messages when full (``discard: new``), so none still to be
read is ever dropped; but it is also history (limits retention), which nothing else frees. The
trainer, which knows what a resume needs, deletes what no role can need again once the stream is
``FULL_AT`` full: raw rollouts the scorers have all acknowledged (each was scored, and the
scored copy stored, before its ack) and scored groups below both its own ack floor and the
replay point of its newest checkpoint (a resume replays from there). Without a checkpoint a
resume replays the whole scored stream, so then no scored group is trimmed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dockyard.broker.plane import DataPlane
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: How often the trainer looks at the stream's fill (a stream-info request each time).
CHECK_EVERY_S = 1.0


class HistoryTrim:
    def __init__(self, plane: DataPlane, replay_point: Callable[[], int]) -> None:
        """``replay_point``: the scored-stream sequence the newest checkpoint's resume replays
        from (0: no checkpoint, so the whole stream)."""
        self.plane = plane
        self.replay_point = replay_point
        self._next_check = 0.0

    async def check_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        await self.check()

    async def check(self) -> None:
        names = self.plane.names
        room = await self.plane.stream_room(names.experience_stream.name)
        if room is None or not room.full:
            return
        rollouts = await self.plane.consumer_lag(names.rollout_consumer)
        scored = await self.plane.consumer_lag(names.scored_consumer)
        raw_below = rollouts.ack_floor + 1
        replay = self.replay_point()
        scored_below = min(scored.ack_floor + 1, replay) if replay > 0 else 1
        await self.plane.trim_history(names.rollouts, raw_below)
        await self.plane.trim_history(names.scored, scored_below)
        after = await self.plane.stream_room(names.experience_stream.name)
        log.warning(
            "trainer.history_trimmed",
            stream=room.stream,
            before=room.describe(),
            after_fill=f"{after.fill:.0%}" if after is not None else "unknown",
            rollouts_below_seq=raw_below,
            scored_below_seq=scored_below,
            hint=(
                "the stream filled: its oldest acknowledged history was deleted (replay and "
                "retrain of those steps need a larger data_plane.streams.max_bytes)"
            ),
        )
