"""The multi-turn terminal_bench toolbox: one ``bash`` tool running commands in the episode's
sandbox session.

An episode gets one sandbox session (``env.terminal_bench.limits``: a fresh work directory and,
as root, uid, bubblewrap and a cgroup per command): the task's ``setup`` script runs when the
session opens, then each ``bash`` call runs its ``command`` with ``env.terminal_bench.shell`` in
that work directory, stderr merged into stdout as on a terminal. Files persist between the
calls of an episode; shell state (the current directory, variables) does not — every call is a
fresh shell, as every call's processes are killed when it returns.

The reward is the check script's on the final state, decided by the scorer, which replays the
calls this tool ran (``terminal_bench_env.replayed_commands``) in a fresh session
(``TerminalBenchEnvironment.score_episode``): the scorer never trusts the worker's sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from dockyard.config.sections.env import EnvConfig, TerminalBenchEnvConfig
from dockyard.environments.base import InvalidScoringInput
from dockyard.environments.sandbox import Sandbox, SandboxResult, SandboxSession
from dockyard.environments.terminal_bench_env import (
    BASH_TOOL,
    MERGE_STDERR,
    command_of,
    run_script,
    run_setup,
)
from dockyard.environments.tools.toolbox import (
    NO_TASK,
    TaskRefused,
    Toolbox,
    ToolLimits,
    ToolSession,
    register_toolbox,
)


def render_result(result: SandboxResult, settings: TerminalBenchEnvConfig) -> str:
    """What the model reads: the output as the terminal shows it (bytes that are not UTF-8
    escaped, not refused: a binary file's ``cat`` is the command's doing), then how it ended."""
    text = result.stdout.decode("utf-8", errors="backslashreplace")
    if text and not text.endswith("\n"):
        text += "\n"
    if result.output_limit_exceeded:
        return text + f"[output over {settings.limits.max_output_bytes} bytes: cut, killed]"
    if result.timed_out:
        return text + f"[killed: over the {settings.limits.wall_time_s:g}s limit]"
    return text + f"[exit {result.returncode}]"


class TerminalSession(ToolSession):
    def __init__(
        self,
        settings: TerminalBenchEnvConfig,
        context: contextlib.AbstractContextManager[SandboxSession],
        session: SandboxSession,
    ) -> None:
        self.settings = settings
        self.context = context
        self.session = session
        # One command at a time (a session is one terminal); aclose waits for it to be killed.
        self.lock = asyncio.Lock()

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({BASH_TOOL})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        command = command_of(arguments, self.settings)
        async with self.lock:
            cancel = threading.Event()
            running = asyncio.ensure_future(
                asyncio.to_thread(
                    run_script,
                    self.session,
                    self.settings.shell,
                    MERGE_STDERR + command,
                    None,  # the sandbox's wall_time_s bounds it
                    cancel,
                )
            )
            try:
                result = await asyncio.shield(running)
            except asyncio.CancelledError:
                # The episode gave up on the call (its timeout): kill the command's process
                # tree and wait until it is gone, so nothing of it outlives the call.
                cancel.set()
                with contextlib.suppress(Exception):
                    await running
                raise
        return render_result(result, self.settings)

    async def aclose(self) -> None:
        async with self.lock:  # a command still being killed finishes first
            await asyncio.to_thread(self.context.__exit__, None, None, None)


@register_toolbox
class TerminalToolbox(Toolbox):
    name = "terminal_bench"

    def __init__(self, settings: TerminalBenchEnvConfig | None = None) -> None:
        self.settings = settings or TerminalBenchEnvConfig()
        limit = ToolLimits().timeout_s
        if self.settings.limits.wall_time_s >= limit:
            # Else the episode's call timeout would strike first and the model would read a
            # different ending than the scorer's replay gets.
            raise ValueError(
                f"env.terminal_bench.limits.wall_time_s={self.settings.limits.wall_time_s:g} "
                f"must be under the tool call timeout ({limit:g}s) for multi-turn episodes"
            )
        self.sandbox = Sandbox(self.settings.limits)

    @classmethod
    def from_env_config(cls, env: EnvConfig) -> TerminalToolbox:
        return cls(env.terminal_bench)

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        setup = task.get("setup", "")
        if not isinstance(setup, str):
            raise TaskRefused("bad_setup_script", "'setup' must be a shell script (a string)")
        context = self.sandbox.session()
        session = await asyncio.to_thread(context.__enter__)
        try:
            await asyncio.to_thread(run_setup, session, self.settings.shell, setup, None, None)
        except InvalidScoringInput as error:
            await asyncio.to_thread(context.__exit__, None, None, None)
            raise TaskRefused(error.reason_code, str(error)) from None
        except BaseException:
            await asyncio.to_thread(context.__exit__, None, None, None)
            raise
        return TerminalSession(self.settings, context, session)
