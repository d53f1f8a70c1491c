"""The multi-turn ``osworld`` toolbox: one ``computer`` tool driving the episode's desktop.

Each episode opens its own desktop on the simulator service (``env.osworld.simulator_url``; a
STAND-IN for OSWorld's VMs) laid out by its task (the record's metadata ``task``), so a
redelivered group replays from scratch on fresh desktops. A call is, in the ``pyautogui`` action
space, ``{"name": "computer", "arguments": {"action": "<pyautogui code | WAIT | DONE | FAIL>"}}``,
and in ``computer_13`` (``env.osworld.action_space``) the action object itself,
``{"name": "computer", "arguments": {"action_type": "CLICK", "x": 20, "y": 20}}``;
the observation after the action is what ``env.osworld.observation_type`` names: the
accessibility tree as text, the desktop's screenshot (an image the episode shows in the tool
message), or both; with a screenshot type the episode's prompt also shows the desktop's first
screenshot after the task's setup (OSWorld's first observation, :meth:`initial_images`). The
reward is decided by the scorer, which replays the actions in a fresh desktop
(:mod:`dockyard.environments.osworld.environment`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dockyard.config.sections.env import EnvConfig, OsworldEnvConfig
from dockyard.environments.osworld.actions import ActionParseError
from dockyard.environments.osworld.controller_client import ControllerUnavailable, SimulatorClient
from dockyard.environments.osworld.session import (
    COMPUTER_TOOL,
    ActionRefused,
    DesktopSession,
    call_step,
)
from dockyard.environments.osworld.tasks import TaskError, parse_task
from dockyard.environments.tools.toolbox import (
    NO_TASK,
    TaskRefused,
    ToolArgumentError,
    Toolbox,
    ToolOutput,
    ToolServiceUnavailable,
    ToolSession,
    register_toolbox,
)


class DesktopToolSession(ToolSession):
    def __init__(self, simulator: SimulatorClient, desktop_id: str, session: DesktopSession):
        self.simulator = simulator
        self.desktop_id = desktop_id
        self.session = session

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({COMPUTER_TOOL})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolOutput:
        try:
            step = call_step(self.session.settings.action_space, arguments)
            return await self.session.act(step)
        except (ActionParseError, ActionRefused) as error:
            raise ToolArgumentError(str(error)) from None
        except ControllerUnavailable as error:
            raise ToolServiceUnavailable(str(error)) from None

    async def initial_images(self) -> tuple[bytes, ...]:
        try:
            return await self.session.screenshots()
        except ControllerUnavailable as error:
            raise ToolServiceUnavailable(str(error)) from None

    async def aclose(self) -> None:
        await self.simulator.close_desktop(self.desktop_id)


@register_toolbox
class DesktopToolbox(Toolbox):
    name = "osworld"

    def __init__(self, settings: OsworldEnvConfig) -> None:
        if settings.simulator_url is None:
            raise ValueError(
                "env.osworld.simulator_url: not set; the desktops are the simulator's "
                "(dockyard osworld serve)"
            )
        self.settings = settings
        self.simulator = SimulatorClient(settings.simulator_url, settings.request_timeout_s)

    @classmethod
    def from_env_config(cls, env: EnvConfig) -> DesktopToolbox:
        return cls(env.osworld)

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        try:
            desktop_task = parse_task(task.get("task"))
        except TaskError as error:
            raise TaskRefused(error.reason, str(error)) from None
        try:
            desktop_id, controller = await self.simulator.open_desktop(desktop_task)
        except ControllerUnavailable as error:
            raise ToolServiceUnavailable(str(error)) from None
        return DesktopToolSession(
            self.simulator, desktop_id, DesktopSession(controller, self.settings)
        )

    async def aclose(self) -> None:
        await self.simulator.aclose()
