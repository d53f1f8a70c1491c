"""The trainer as a role process holds it from launch: its status file, messages and stop
switch exist at once (heartbeats, the metrics port and the shutdown signals need them while
the policy is still loading), and :meth:`TrainerRole.run` opens the loop
(:func:`~dockyard.consumers.trainer.loop.open_trainer`, which builds it off the event loop) and
runs it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from dockyard.broker.typed import MessagePlane
from dockyard.consumers.trainer.loop import TrainerLoop
from dockyard.consumers.trainer.progress import TrainerSummary
from dockyard.observability.status_files import StatusFile

#: ``open_trainer`` with every argument but ``stopping`` given.
Opener = Callable[..., Awaitable[TrainerLoop]]


class TrainerRole:
    def __init__(self, opener: Opener, *, messages: MessagePlane, status: StatusFile) -> None:
        """``messages`` and ``status``: the ones ``opener`` gives the loop."""
        self.opener = opener
        self.messages = messages
        self.status = status
        # A stop asked for while the policy loads is kept: the loop drains at once.
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        self.stopping.set()

    async def run(self) -> TrainerSummary:
        loop = await self.opener(stopping=self.stopping)
        return await loop.run()
