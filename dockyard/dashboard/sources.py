"""Where the dashboard's fleet panels come from: the data plane (roles' heartbeats, streams,
dead letters) when one is reachable, else the run directory's status files (roles only)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from dockyard.broker.admin import AdminPlane
from dockyard.fleet.dead_letter_pages import dead_letter_page
from dockyard.fleet.overview import DeadLetterTally, gather_overview
from dockyard.observability.status_files import read_statuses

#: The fleet view counts at most this many of the newest dead letters on each refresh.
DEAD_LETTERS_COUNTED = 10_000


class FleetSource(Protocol):
    async def fleet(self) -> dict[str, object]: ...

    async def dead_letters(self, *, before: int | None, size: int) -> dict[str, object]: ...


class PlaneSource:
    """The fleet as the data plane shows it (the plane is opened and closed by the caller)."""

    def __init__(self, plane: AdminPlane) -> None:
        self.plane = plane
        # Kept across refreshes: each dead letter is decoded once, not on every poll.
        self.tally = DeadLetterTally(DEAD_LETTERS_COUNTED)

    async def fleet(self) -> dict[str, object]:
        overview = await gather_overview(self.plane, self.tally)
        return {"source": "data plane", **overview.to_json()}

    async def dead_letters(self, *, before: int | None, size: int) -> dict[str, object]:
        return (await dead_letter_page(self.plane, before=before, size=size)).to_json()


class StatusFilesSource:
    """A run directory without its broker: the roles' last status files, no streams."""

    def __init__(self, status_dir: Path) -> None:
        self.status_dir = status_dir

    async def fleet(self) -> dict[str, object]:
        now = time.time()
        statuses = read_statuses(self.status_dir) if self.status_dir.is_dir() else []
        roles = []
        for status in statuses:
            counters = dict(status.counters)
            version = counters.pop("weight_version", None)
            roles.append(
                {
                    "role": status.role,
                    "instance": status.instance,
                    "state": status.state,
                    "detail": status.detail,
                    "weight_version": None if version is None else int(version),
                    "counters": counters,
                    "age_s": now - status.updated_at_unix_s,
                    # Status files are written on events, not on a beat: no silence to tell.
                    "silent": None,
                }
            )
        return {
            "source": f"status files in {self.status_dir}",
            "taken_at_unix_s": now,
            "roles": roles,
            "streams": [],
            "dead_letters": None,
        }

    async def dead_letters(self, *, before: int | None, size: int) -> dict[str, object]:
        return {"items": [], "older_before": None, "stored": None}
