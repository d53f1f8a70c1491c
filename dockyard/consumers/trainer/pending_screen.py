"""Screens that refuse scored groups before a step: the bookkeeping they share.

A screen judges each pending group once (the first step it is pending for), dead-letters the
refused ones with their reason and drops them from the ledger, and hands the rest on. Only what
is still pending is remembered, so the memory is bounded by the pending queue. Subclasses say
why a group is refused (:meth:`PendingScreen.refusals`); :mod:`.worker_trust` (workers whose
log-probs disagree with the trainer's) and :mod:`.image_screen` (images that disagree with their
token ids) are the two.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Protocol, TypeVar

from dockyard.broker.plane import DataPlane, DataPlaneError
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.schemas import ScoredRollout
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class PendingGroup(Protocol):
    """A scored group waiting for a step, with its place in the scored stream."""

    @property
    def scored(self) -> ScoredRollout: ...

    @property
    def seq(self) -> int: ...


P = TypeVar("P", bound=PendingGroup)


class PendingScreen(abc.ABC):
    """Judge each pending group once; dead-letter (and drop from the ledger) the refused."""

    #: The warning logged for each refused group.
    event = "trainer.dropped_group"

    def __init__(self, plane: DataPlane, ledger: Callable[[], Ledger]) -> None:
        self.plane = plane
        self.ledger = ledger  # the trainer replaces its ledger on resume: read it when used
        self._judged: set[str] = set()

    @abc.abstractmethod
    async def refusals(self, fresh: list[ScoredRollout]) -> dict[str, tuple[str, str]]:
        """``{group_id: (reason, detail)}`` for the groups of ``fresh`` to refuse."""

    async def screen(self, pending: list[P]) -> list[P]:
        """``pending`` without the refused groups (those are dead-lettered)."""
        fresh = [p for p in pending if p.scored.group_id not in self._judged]
        # Bounded: only what is still pending is remembered.
        self._judged = {p.scored.group_id for p in pending}
        if not fresh:
            return pending
        refused = await self.refusals([p.scored for p in fresh])
        for item in fresh:
            verdict = refused.get(item.scored.group_id)
            if verdict is not None:
                reason, detail = verdict
                await dead_letter_pending(self.plane, self.ledger(), item, reason, detail)
                log.warning(self.event, group_id=item.scored.group_id, reason=reason, why=detail)
        return [p for p in pending if p.scored.group_id not in refused]


async def dead_letter_pending(
    plane: DataPlane, ledger: Ledger, item: PendingGroup, reason: str, detail: str
) -> None:
    """A pending group refused before a step: its scored message to the dead letters with
    ``reason``, and the group dropped from the ledger (never silently lost)."""
    group_id = item.scored.group_id
    stream = plane.names.scored_consumer.stream
    try:
        original = await plane.get(stream, item.seq)
        await plane.publish_dead_letter(original, reason, detail, stage="trainer")
    except (KeyError, DataPlaneError) as error:
        # The drop stands either way (the ledger records it with the same reason).
        log.error("trainer.dead_letter_failed", group_id=group_id, error=repr(error))
    ledger.record_dropped(group_id, f"{reason}: {detail}")
