"""The trainer's watch on the dead letters: a group one of whose messages was dead-lettered (its
prompt, rollout or scored rollout) will never arrive, so it is dropped with the dead letter's
reason at once, instead of holding the dispatcher's budget until the pipeline next runs dry."""

from __future__ import annotations

import time
from collections.abc import Callable

from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.typed import MessagePlane
from dockyard.consumers.trainer.progress import Progress
from dockyard.schemas import CodecError, PromptGroup, Rollout, ScoredRollout
from dockyard.schemas.prompt import group_id_of
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: How often the trainer looks for dead letters of the groups it waits for.
CHECK_EVERY_S = 2.0
#: The messages of a group, by schema name (their ids carry the group id).
GROUP_MESSAGES = (PromptGroup.SCHEMA_NAME, Rollout.SCHEMA_NAME, ScoredRollout.SCHEMA_NAME)


class DeadLetterWatch:
    def __init__(
        self, messages: MessagePlane, progress: Progress, awaited: Callable[[], set[str]]
    ) -> None:
        """``awaited``: the groups dispatched and not settled that have not reached the trainer
        (``Intake.awaited_groups``)."""
        self.messages = messages
        self.progress = progress
        self.awaited = awaited
        self.seen = 0  # the dead-letter stream's last sequence read
        self.next_check = 0.0

    async def check_if_due(self) -> None:
        if time.monotonic() >= self.next_check:
            await self.check()

    async def check(self) -> None:
        """Read the dead letters since the last check; drop each awaited group among them."""
        self.next_check = time.monotonic() + CHECK_EVERY_S
        awaited = self.awaited()
        names = self.messages.names
        async for stored in self.messages.plane.replay(names.dead_letters, from_seq=self.seen + 1):
            self.seen = stored.seq
            try:
                letter = read_dead_letter(stored)
            except CodecError:
                continue
            group_id = group_id_of(letter.original_message_id or "", GROUP_MESSAGES)
            if group_id in awaited:
                awaited.discard(group_id)
                self.progress.ledger.record_dropped(
                    group_id, f"dead letter from {letter.stage}: {letter.reason}"
                )
                log.warning(
                    "trainer.dropped_dead_lettered", group_id=group_id, reason=letter.reason
                )
