"""What the trainer needs from the dispatcher, as a protocol: the trainer process hosts the
dispatcher, but the consumer code never imports the producer code (roles meet through the
broker; the ``dockyard trainer`` command wires the two together)."""

from __future__ import annotations

from typing import Protocol


class PromptSourceCounts(Protocol):
    @property
    def skipped_too_long(self) -> int:
        """Prompts over ``data.max_input_seq_length``, never dispatched."""


class PromptSource(Protocol):
    @property
    def state(self) -> PromptSourceCounts:
        """The dispatcher's counters (the trainer reports them in its metrics)."""

    @property
    def exhausted(self) -> bool:
        """Every epoch has been dispatched."""

    async def top_up(self, in_flight: int, weight_version: int) -> list[str]:
        """Dispatch up to the pacing budget; the group ids dispatched."""

    def state_dict(self) -> dict[str, int]: ...

    def load_state_dict(self, state: dict[str, int]) -> None: ...
