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

from collections.abc import Mapping
from typing import Any

from dockyard.config.sections.env import EnvConfig, TerminalBenchEnvConfig
from dockyard.environments.sandbox import SandboxResult
from dockyard.environments.terminal_bench_env import (
    BASH_TOOL,
    MERGE_STDERR,
    command_of,
    run_script,
)
from dockyard.environments.tools.files import FILE_TOOLS, render_shell
from dockyard.environments.tools.sandboxed import (
    SandboxedToolSession,
    episode_sandbox,
    open_with_setup,
)
from dockyard.environments.tools.toolbox import (
    NO_TASK,
    Toolbox,
    ToolSession,
    register_toolbox,
)


def render_result(result: SandboxResult, settings: TerminalBenchEnvConfig) -> str:
    return render_shell(result, settings.limits)


class TerminalSession(SandboxedToolSession[TerminalBenchEnvConfig]):
    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({BASH_TOOL})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        command = command_of(arguments, self.settings)
        result = await self.run_in_sandbox(
            lambda cancel: run_script(
                self.session,
                self.settings.shell,
                MERGE_STDERR + command,
                None,  # the sandbox's wall_time_s bounds it
                cancel,
            )
        )
        return render_result(result, self.settings)


@register_toolbox
class TerminalToolbox(Toolbox):
    name = "terminal_bench"

    def __init__(self, settings: TerminalBenchEnvConfig | None = None) -> None:
        self.settings = settings or TerminalBenchEnvConfig.model_validate({})
        self.sandbox = episode_sandbox(self.settings.limits, "env.terminal_bench")

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [FILE_TOOLS[BASH_TOOL].schema()]  # the same tool, described once

    @classmethod
    def from_env_config(cls, env: EnvConfig) -> TerminalToolbox:
        return cls(env.terminal_bench)

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        context, session = await open_with_setup(self.sandbox, self.settings.shell, task)
        return TerminalSession(self.settings, context, session)
