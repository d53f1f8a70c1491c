"""When a refit may land on a rollout worker running multi-turn episodes.

``grpo.async_grpo.in_flight_weight_updates``: with ``true`` a refit lands whenever its weight
event arrives — between two turns of an episode, or inside a turn as the engine's
``policy.generation.inflight_refit_policy`` says — and every token records the version that
produced it. With ``false`` a refit waits until the episodes in hand have ended ("drain first"),
so an episode's tokens all come from one version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class RefitGate:
    def __init__(self, *, in_flight_weight_updates: bool) -> None:
        self.in_flight = in_flight_weight_updates
        self.running_episodes = 0
        self.changed = asyncio.Condition()
        #: Set while a refit waits for episodes to end (what a drain is waiting on, observable).
        self.refit_waiting = asyncio.Event()

    @asynccontextmanager
    async def episodes(self) -> AsyncIterator[None]:
        async with self.changed:
            self.running_episodes += 1
        try:
            yield
        finally:
            async with self.changed:
                self.running_episodes -= 1
                self.changed.notify_all()

    @asynccontextmanager
    async def refit(self) -> AsyncIterator[None]:
        """Held while a refit is applied: no episodes start meanwhile without in-flight updates."""
        if self.in_flight:
            yield
            return
        async with self.changed:
            if self.running_episodes:
                self.refit_waiting.set()
                await self.changed.wait_for(lambda: self.running_episodes == 0)
                self.refit_waiting.clear()
            yield
