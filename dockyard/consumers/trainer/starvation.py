"""When no scored data comes: warn, then end the run with a diagnosis (``run.starvation_*``).

A role still loading its engine is not starving the trainer, it is late: starvation time counts
only while every role the trainer waits for reports itself ready (heartbeats), and a role that
never gets ready ends the run after the separate, longer ``run.role_start_timeout_s``, named.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dockyard.broker.plane import DataPlane
from dockyard.config.sections.run import RunConfig
from dockyard.consumers.trainer.health import diagnose, fleet_readiness
from dockyard.observability.status_files import StatusFile
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class TrainerStarved(RuntimeError):
    """No scored data for ``run.starvation_timeout_s`` while the roles it waits for were ready,
    or for ``run.role_start_timeout_s`` while one was still starting: the run ends with the
    diagnosis."""


class StarvationWatch:
    def __init__(
        self,
        run: RunConfig,
        plane: DataPlane,
        status: StatusFile,
        *,
        waiting_for_data: Callable[[], bool],
        drop_lost_groups: Callable[[], None],
    ) -> None:
        """``waiting_for_data``: whether groups are in flight that have not reached the trainer
        (then a pipeline with nothing in flight has lost them: ``drop_lost_groups``)."""
        self.run = run
        self.plane = plane
        self.status = status
        self.waiting_for_data = waiting_for_data
        self.drop_lost_groups = drop_lost_groups
        self.last_data = time.monotonic()
        # The clock runs from the later of the last data and the moment the last awaited role
        # reported itself ready; warned once per silence.
        self._fleet_ready_since = 0.0
        self._warned = False
        self._next_starting_log = 0.0

    def fed(self) -> None:
        """Scored data came in: the silence (if any) is over."""
        self.last_data, self._warned = time.monotonic(), False

    async def check(self) -> None:
        """No scored data since the last :meth:`fed`: warn, or raise :class:`TrainerStarved`."""
        run = self.run
        now = time.monotonic()
        readiness = fleet_readiness(self.status.directory)
        if readiness.starting:
            self._fleet_ready_since = now
            waited = now - self.last_data
            if now >= self._next_starting_log:
                self._next_starting_log = now + run.starvation_warning_s
                log.info(
                    "trainer.waiting_for_roles",
                    starting=list(readiness.starting),
                    ready=list(readiness.ready),
                    waited_s=round(waited),
                )
                self.status.update(detail=f"waiting for {', '.join(readiness.starting)} to start")
            if waited > run.role_start_timeout_s:
                diagnosis = await diagnose(self.plane)
                raise TrainerStarved(
                    f"no scored data for {waited:.0f}s, roles still starting after "
                    f"run.role_start_timeout_s={run.role_start_timeout_s:g}; "
                    f"{readiness.describe()}; {diagnosis.describe()}"
                )
            return
        idle = now - max(self.last_data, self._fleet_ready_since)
        if idle > run.starvation_warning_s and not self._warned:
            diagnosis = await diagnose(self.plane)
            log.warning(
                "trainer.starving",
                idle_s=round(idle),
                detail=diagnosis.describe(),
                roles=readiness.describe(),
            )
            self.status.update(detail=diagnosis.describe())
            self._warned = True
            if diagnosis.nothing_in_flight and self.waiting_for_data():
                self.drop_lost_groups()
        if idle > run.starvation_timeout_s:
            diagnosis = await diagnose(self.plane)
            raise TrainerStarved(
                f"no scored data for {idle:.0f}s with the roles it waits for ready; "
                f"{readiness.describe()}; {diagnosis.describe()}"
            )
