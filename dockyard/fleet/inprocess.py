"""Running the roles of one run as tasks of one event loop (``data_plane: null``).

The counterpart of :mod:`dockyard.fleet.supervisor` for one process: the roles share a
``MemoryPlane``, so a role that dies cannot be restarted on its own (what it held in the plane
went with nothing, but a fresh instance would need the whole run's state) — a role that fails
ends the run, naming it. The run ends when the main role (the trainer) returns; then every other
role is asked to stop, as ``dockyard run`` SIGTERMs its processes, and cancelled after
``drain_timeout_s`` if it has not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: As long as ``dockyard run`` gives a role process between SIGTERM and SIGKILL.
DRAIN_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class RoleTask:
    """One role instance: ``run`` until done; ``stop`` asks it to drain and return."""

    name: str  # role-instance, as in the status files: trainer-0, rollout-1
    run: Callable[[], Awaitable[Any]]
    stop: Callable[[], None]


class RoleFailed(Exception):
    """A role raised, or returned while the run still needed it."""

    def __init__(self, name: str, error: BaseException | None) -> None:
        what = f"{type(error).__name__}: {error}" if error is not None else "it exited early"
        super().__init__(f"{name} failed: {what}")
        self.name = name
        self.error = error


class InProcessFleet:
    def __init__(
        self,
        main: RoleTask,
        helpers: Sequence[RoleTask],
        *,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        self.main = main
        self.helpers = list(helpers)
        self.drain_timeout_s = drain_timeout_s
        self.stop_requested = False
        self._tasks: dict[asyncio.Task[Any], RoleTask] = {}

    def request_stop(self) -> None:
        """Ctrl-C / SIGTERM: every role drains; the run ends when the main role has returned.
        A second request does not wait for the drain."""
        if self.stop_requested:
            for task in self._tasks:
                task.cancel()
            return
        self.stop_requested = True
        log.info("fleet.stopping", reason="stop requested")
        for role in (self.main, *self.helpers):
            role.stop()

    async def run(self, on_tick: Callable[[], None], tick_s: float) -> Any:
        """The main role's result. :class:`RoleFailed` when any role fails, or when a helper
        returns before the main role did without a stop having been asked for."""
        for role in (self.main, *self.helpers):
            self._tasks[asyncio.create_task(self._run_role(role), name=role.name)] = role
        failure: RoleFailed | None = None
        main_task = next(t for t, r in self._tasks.items() if r is self.main)
        try:
            while not main_task.done():
                # The timeout is the display's refresh, not a wait for any role: a role that
                # ends wakes this at once.
                done, _ = await asyncio.wait(
                    self._tasks, timeout=tick_s, return_when=asyncio.FIRST_COMPLETED
                )
                on_tick()
                failed = [t for t in done if t is not main_task and not self.stop_requested]
                if failed:
                    failure = self._failure(failed[0])
                    break
        finally:
            await self._stop_all()
        if failure is not None:
            raise failure
        if main_task.cancelled():
            raise RoleFailed(self.main.name, asyncio.CancelledError("cancelled"))
        if main_task.exception() is not None:
            raise self._failure(main_task)
        return main_task.result()

    async def _run_role(self, role: RoleTask) -> Any:
        # Each task runs in a copy of the context: the binding tags this role's log lines
        # (and those of the threads it starts) without touching the others'.
        structlog.contextvars.bind_contextvars(role=role.name)
        return await role.run()

    def _failure(self, task: asyncio.Task[Any]) -> RoleFailed:
        name = self._tasks[task].name
        if task.cancelled():
            return RoleFailed(name, asyncio.CancelledError("cancelled"))
        return RoleFailed(name, task.exception())

    async def _stop_all(self) -> None:
        """Ask every role still running to drain, then cancel what has not within the time."""
        running = [t for t in self._tasks if not t.done()]
        for task in running:
            self._tasks[task].stop()
        if running:
            _, late = await asyncio.wait(running, timeout=self.drain_timeout_s)
            for task in late:
                log.warning("fleet.cancelling", role=self._tasks[task].name)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*late, return_exceptions=True)
        for task, role in self._tasks.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                # With its traceback: the one line the command prints names only the error.
                log.error("fleet.role_failed", role=role.name, exc_info=task.exception())
