"""Saying which stage starves the trainer, instead of waiting silently."""

from __future__ import annotations

from dataclasses import dataclass

from dockyard.broker.plane import DataPlane


@dataclass(frozen=True)
class PipelineDiagnosis:
    prompts_waiting: int  # dispatched, not yet taken by a rollout worker
    rollouts_waiting: int  # generated, not yet taken by a scorer
    scored_waiting: int  # scored, not yet taken by the trainer
    dead_letters: int

    @property
    def nothing_in_flight(self) -> bool:
        return not (self.prompts_waiting or self.rollouts_waiting or self.scored_waiting)

    @property
    def starving_stage(self) -> str:
        if self.scored_waiting:
            return "trainer (scored groups are waiting; the trainer is not fetching them)"
        if self.rollouts_waiting:
            return "scorers (rollouts are waiting to be scored: are scorers running?)"
        if self.prompts_waiting:
            return "rollout workers (prompts are waiting: are rollout workers running?)"
        if self.dead_letters:
            return (
                f"dead letters ({self.dead_letters} messages were refused; see `dockyard replay`)"
            )
        return "dispatcher (nothing is in flight)"

    def describe(self) -> str:
        return (
            f"starving: {self.starving_stage}; prompts waiting {self.prompts_waiting}, "
            f"rollouts waiting {self.rollouts_waiting}, scored waiting {self.scored_waiting}, "
            f"dead letters {self.dead_letters}"
        )


async def diagnose(plane: DataPlane) -> PipelineDiagnosis:
    names = plane.names
    prompts = await plane.consumer_lag(names.prompt_consumer)
    rollouts = await plane.consumer_lag(names.rollout_consumer)
    scored = await plane.consumer_lag(names.scored_consumer)
    dead = 0
    for stream in await plane.streams():
        if stream.name == names.dead_letters_stream.name:
            dead = stream.messages
    return PipelineDiagnosis(
        prompts_waiting=prompts.backlog,
        rollouts_waiting=rollouts.backlog,
        scored_waiting=scored.backlog,
        dead_letters=dead,
    )
