"""Role heartbeats as small JSON files, so a supervisor (``dockyard run``) can show per-role
health without joining the data plane. Written atomically (temp file + rename)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

#: A role's state until it can take work (its engine loaded, its first weights in): the
#: trainer does not count its starvation time while a role it waits for says so.
STARTING = "starting"
#: A role's state while it takes work.
RUNNING = "running"
#: The trainer's state once its last step, validation and checkpoint are done.
FINISHED = "finished"


@dataclass
class RoleStatus:
    role: str
    instance: str
    state: str = STARTING  # starting | running | draining | stopped | unhealthy | failed
    detail: str = ""
    counters: dict[str, float] = field(default_factory=dict)
    updated_at_unix_s: float = 0.0
    pid: int = field(default_factory=os.getpid)


class StatusFile:
    """Writes one role instance's status into ``directory`` (no-op when ``directory`` is None)."""

    def __init__(self, directory: Path | str | None, role: str, instance: str) -> None:
        self.status = RoleStatus(role=role, instance=instance)
        self.directory = Path(directory) if directory else None
        self.path = self.directory / f"{role}-{instance}.json" if self.directory else None

    def update(
        self, state: str | None = None, detail: str | None = None, **counters: float
    ) -> None:
        if state is not None:
            if state != self.status.state and detail is None:
                # A detail describes the state it was given with ("loading the tokenizer" while
                # starting); left in place it would be read as the new state's.
                self.status.detail = ""
            self.status.state = state
        if detail is not None:
            self.status.detail = detail
        self.status.counters.update(counters)
        self.status.updated_at_unix_s = time.time()
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.status.__dict__))
        temporary.replace(self.path)


def read_statuses(directory: Path) -> list[RoleStatus]:
    statuses = []
    for path in sorted(directory.glob("*.json")):
        try:
            statuses.append(RoleStatus(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # being replaced right now; the next poll reads it
    return statuses
