"""What the trainer needs from the dispatcher, as a protocol: the trainer process hosts the
dispatcher, but the consumer code never imports the producer code (roles meet through the
broker; the ``dockyard trainer`` command wires the two together). It declares exactly what the
trainer's rooms read and call, nothing more."""

from __future__ import annotations

from typing import Protocol


class PromptSourceCounters(Protocol):
    @property
    def skipped_too_long(self) -> int:
        """Prompts over ``data.max_input_seq_length``, never dispatched (a step metric)."""


class PromptSource(Protocol):
    @property
    def exhausted(self) -> bool:
        """Every epoch has been dispatched."""

    @property
    def state(self) -> PromptSourceCounters:
        """Its counters."""

    async def top_up(self, in_flight: int, weight_version: int) -> list[str]:
        """Dispatch up to the pacing budget; the group ids dispatched."""

    def state_dict(self) -> dict[str, int]:
        """Its position, for a checkpoint."""

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Back to a checkpoint's position."""
