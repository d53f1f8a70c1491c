"""Saying which stage starves the trainer, instead of waiting silently, and which of the roles
it waits for are still starting (their heartbeats say so) rather than ready but silent."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dockyard.broker.plane import DataPlane
from dockyard.observability.status_files import RUNNING, STARTING, RoleStatus, read_statuses

#: The roles whose work reaches the trainer (the dispatcher runs inside the trainer itself).
AWAITED_ROLES = ("rollout", "scorer")


@dataclass(frozen=True)
class PipelineDiagnosis:
    prompts_waiting: int  # dispatched, not yet taken by a rollout worker
    rollouts_waiting: int  # generated, not yet taken by a scorer
    scored_waiting: int  # scored, not yet taken by the trainer
    dead_letters: int
    #: Streams at their limits (``StreamRoom.describe``): their publishers wait for room.
    full_streams: tuple[str, ...] = ()

    @property
    def nothing_in_flight(self) -> bool:
        # A full stream's publishers hold groups they could not store yet: not lost.
        waiting = self.prompts_waiting or self.rollouts_waiting or self.scored_waiting
        return not (waiting or self.full_streams)

    @property
    def starving_stage(self) -> str:
        if self.full_streams:
            return (
                f"{'; '.join(self.full_streams)}: its publishers wait for room "
                f"(data_plane.publish.full_stream_wait_s); raise data_plane.streams.max_bytes "
                f"or max_msgs, or see why its readers do not catch up"
            )
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
    # The sequence of the newest dead letter counts every message refused in this namespace
    # (the stream holds nothing else), including those its limits dropped since; the stream
    # survey that would give the stored count is the operator's, not a role's.
    newest = await plane.latest(names.dead_letters)
    dead = 0 if newest is None else newest.seq
    full = []
    for spec in (names.prompts_stream, names.experience_stream):
        room = await plane.stream_room(spec.name)
        if room is not None and room.full:
            full.append(room.describe())
    return PipelineDiagnosis(
        prompts_waiting=prompts.backlog,
        rollouts_waiting=rollouts.backlog,
        scored_waiting=scored.backlog,
        dead_letters=dead,
        full_streams=tuple(full),
    )


@dataclass(frozen=True)
class FleetReadiness:
    """The awaited roles by their latest heartbeat; all empty when no heartbeats are read."""

    starting: tuple[str, ...] = ()  # loading an engine, waiting for the first weights, ...
    ready: tuple[str, ...] = ()
    other: tuple[str, ...] = ()  # stopped, unhealthy, ... ("name (state)")

    def describe(self) -> str:
        if not (self.starting or self.ready or self.other):
            return "no role heartbeats seen"
        parts = [
            f"still starting: {', '.join(self.starting) or 'none'}",
            f"ready but silent: {', '.join(self.ready) or 'none'}",
        ]
        if self.other:
            parts.append(f"neither: {', '.join(self.other)}")
        return "; ".join(parts)


def readiness_of(statuses: list[RoleStatus]) -> FleetReadiness:
    starting: list[str] = []
    ready: list[str] = []
    other: list[str] = []
    for status in statuses:
        if status.role not in AWAITED_ROLES:
            continue
        name = f"{status.role}-{status.instance}"
        if status.state == STARTING:
            starting.append(name)
        elif status.state == RUNNING:
            # What a silent role says about itself is the likeliest cause (a service it needs).
            ready.append(f"{name} ({status.detail})" if status.detail else name)
        else:
            other.append(f"{name} ({status.state})")
    return FleetReadiness(tuple(starting), tuple(ready), tuple(other))


def fleet_readiness(status_dir: Path | None) -> FleetReadiness:
    """From the heartbeat files the roles write next to the trainer's (``--status-dir``, which
    ``dockyard run`` gives every role). Without one the trainer cannot tell a starting role from
    a silent one, and counts them all as ready, as before heartbeats were read."""
    if status_dir is None or not status_dir.exists():
        return FleetReadiness()
    return readiness_of(read_statuses(status_dir))
