"""The multi-turn ``gdpval`` toolbox: file tools in the episode's sandbox session.

An episode gets one sandbox session (``env.gdpval.limits``), with the task's ``setup`` script
run when it opens; the agent produces the deliverables with ``bash``, ``write_file``,
``read_file`` and ``list_files`` (:mod:`dockyard.environments.tools.files`). The reward is the
judge's grade of the deliverables on the final state, which the scorer rebuilds by replaying
the calls that changed files in a fresh session (``GdpvalEnvironment``): it never reads the
worker's sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dockyard.config.sections.env import EnvConfig, GdpvalEnvConfig
from dockyard.environments.gdpval_env import GDPVAL_TOOLS, file_tool_settings
from dockyard.environments.tools.files import FILE_TOOLS, FileToolSettings, apply_call
from dockyard.environments.tools.sandboxed import (
    SandboxedToolSession,
    episode_sandbox,
    open_with_setup,
)
from dockyard.environments.tools.toolbox import NO_TASK, Toolbox, ToolSession, register_toolbox


class GdpvalSession(SandboxedToolSession[FileToolSettings]):
    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset(GDPVAL_TOOLS)

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        return await self.run_in_sandbox(
            lambda cancel: apply_call(self.session, name, arguments, self.settings, cancel=cancel)
        )


@register_toolbox
class GdpvalToolbox(Toolbox):
    name = "gdpval"

    def __init__(self, settings: GdpvalEnvConfig | None = None) -> None:
        self.settings = settings or GdpvalEnvConfig.model_validate({})
        self.sandbox = episode_sandbox(self.settings.limits, "env.gdpval")

    @classmethod
    def from_env_config(cls, env: EnvConfig) -> GdpvalToolbox:
        return cls(env.gdpval)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [FILE_TOOLS[name].schema() for name in GDPVAL_TOOLS]

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        context, session = await open_with_setup(self.sandbox, self.settings.shell, task)
        return GdpvalSession(file_tool_settings(self.settings), context, session)
