"""A tool session over one sandbox session: one call at a time, a cancelled call killed whole.

The terminal and the file toolboxes (``terminal_bench``, ``gdpval``) hold an episode's
:class:`SandboxSession` open for the episode's calls; this is what they share: the lock that
makes the session one terminal, running a blocking sandbox call in a thread, and, when the
episode gives up on a call (its timeout), killing the call's process tree and waiting until it
is gone, so nothing of it outlives the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from dockyard.config.sections.env import SandboxLimits
from dockyard.environments.base import InvalidScoringInput
from dockyard.environments.sandbox import Sandbox, SandboxSession
from dockyard.environments.terminal_bench_env import run_setup
from dockyard.environments.tools.toolbox import TaskRefused, ToolLimits, ToolSession

_Result = TypeVar("_Result")
_Settings = TypeVar("_Settings")


class SandboxedToolSession(ToolSession, Generic[_Settings]):
    """``settings``: the toolbox's (its environment's section, or the file tools' rules)."""

    def __init__(
        self,
        settings: _Settings,
        context: contextlib.AbstractContextManager[SandboxSession],
        session: SandboxSession,
    ) -> None:
        self.settings = settings
        self.context = context
        self.session = session
        self.lock = asyncio.Lock()

    async def run_in_sandbox(self, work: Callable[[threading.Event], _Result]) -> _Result:
        """``work(cancel)`` in a thread, alone in the session; ``cancel`` is set (and the work
        awaited) when the calling task is cancelled."""
        async with self.lock:
            cancel = threading.Event()
            running = asyncio.ensure_future(asyncio.to_thread(work, cancel))
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                cancel.set()
                with contextlib.suppress(Exception):
                    await running
                raise

    async def aclose(self) -> None:
        async with self.lock:  # a command still being killed finishes first
            await asyncio.to_thread(self.context.__exit__, None, None, None)


async def open_with_setup(
    sandbox: Sandbox, shell: str, task: Mapping[str, Any]
) -> tuple[contextlib.AbstractContextManager[SandboxSession], SandboxSession]:
    """A fresh sandbox session with the task's ``setup`` script run in it (TaskRefused: the
    task's setup is not a script or fails — the task's fault, not the model's)."""
    setup = task.get("setup", "")
    if not isinstance(setup, str):
        raise TaskRefused("bad_setup_script", "'setup' must be a shell script (a string)")
    context = sandbox.session()
    session = await asyncio.to_thread(context.__enter__)
    try:
        await asyncio.to_thread(run_setup, session, shell, setup, None, None)
    except InvalidScoringInput as error:
        await asyncio.to_thread(context.__exit__, None, None, None)
        raise TaskRefused(error.reason_code, str(error)) from None
    except BaseException:
        await asyncio.to_thread(context.__exit__, None, None, None)
        raise
    return context, session


def episode_sandbox(limits: SandboxLimits, key: str) -> Sandbox:
    """The sandbox of a toolbox's episodes; its wall clock must be under the tool call timeout,
    else the episode's timeout would strike first and the model would read a different ending
    than the scorer's replay gets."""
    timeout = ToolLimits().timeout_s
    if limits.wall_time_s >= timeout:
        raise ValueError(
            f"{key}.limits.wall_time_s={limits.wall_time_s:g} must be under the tool call "
            f"timeout ({timeout:g}s) for multi-turn episodes"
        )
    return Sandbox(limits)
