"""One episode's desktop: the agent's actions in, the observation out (OSWorld's env.step).

The same rules serve the episode's tool (:mod:`dockyard.environments.tools.desktop`) and the
scorer's replay (:mod:`.environment`), so the replay refuses exactly what the tool refused and
reaches the state the agent saw:

- a ``computer`` call is read in the run's action space (``env.osworld.action_space``) into a
  :class:`Step`: ``pyautogui`` — ``{"action": "<code | WAIT | DONE | FAIL>"}``, the code read
  by :func:`.actions.parse_actions`; ``computer_13`` — the arguments are the action object
  itself, read by :func:`.computer13.parse_action` (refused: :class:`ActionParseError`);
- ``WAIT`` stands alone and only observes; ``DONE`` / ``FAIL`` stand alone and end the task —
  any action after them is refused (:class:`ActionRefused`), as is any past ``max_actions``;
- anything else is sent to the controller's ``/execute`` as OSWorld sends it (a ``computer_13``
  action as its pyautogui command); a program the controller refuses is one action taken, and
  its error is part of the observation.

The observation is what ``env.osworld.observation_type`` names, as OSWorld's: the accessibility
tree as text (``a11y_tree``), the controller's screenshot (``screenshot``: a PNG the episode
shows as an image), or both (``screenshot_a11y_tree``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dockyard.config.sections.env import OsworldActionSpace, OsworldEnvConfig
from dockyard.environments.osworld import computer13
from dockyard.environments.osworld.accessibility import Node, linearize, parse_tree
from dockyard.environments.osworld.actions import (
    ActionParseError,
    Special,
    extract_code,
    parse_actions,
)
from dockyard.environments.osworld.controller_client import DesktopController
from dockyard.environments.tools.toolbox import ToolArgumentError, ToolOutput

#: The episode's one tool, ``computer``; its arguments depend on the action space.
COMPUTER_TOOL = "computer"
PYAUTOGUI_CALL = '{"action": "<pyautogui code | DONE | FAIL | WAIT>"}'


@dataclass(frozen=True)
class Step:
    """One action, read: an answer (``WAIT`` / ``DONE`` / ``FAIL``) or code for ``/execute``."""

    answer: str | None = None
    code: str = ""


def action_of(arguments: Mapping[str, Any]) -> str:
    """A ``pyautogui`` ``computer`` call's action code; the replay reads calls with this rule."""
    action = arguments.get("action")
    if set(arguments) != {"action"} or not isinstance(action, str):
        raise ToolArgumentError(f"needs exactly {PYAUTOGUI_CALL}")
    return action


def pyautogui_step(code: str) -> Step:
    """The step a ``pyautogui`` code stands for (ActionParseError for what the space refuses)."""
    actions = parse_actions(code)
    specials = [action for action in actions if isinstance(action, Special)]
    if not specials:
        return Step(code=code)
    if len(actions) > 1:
        raise ActionParseError("WAIT, DONE and FAIL stand alone, without other actions")
    return Step(answer=specials[0].code)


def computer13_step(action: computer13.Computer13Action) -> Step:
    if action.answer is not None:
        return Step(answer=action.answer)
    return Step(code=computer13.to_pyautogui(action))


def call_step(action_space: OsworldActionSpace, arguments: Mapping[str, Any]) -> Step:
    """A ``computer`` call's step. ToolArgumentError: not the call's shape; ActionParseError: not
    an action of the space."""
    if action_space == "computer_13":
        return computer13_step(computer13.parse_action(dict(arguments)))
    return pyautogui_step(action_of(arguments))


def response_steps(action_space: OsworldActionSpace, text: str) -> list[Step]:
    """A single-turn response's steps: its last fenced block, else the whole text."""
    if action_space == "computer_13":
        return [computer13_step(action) for action in computer13.parse_response(text)]
    return [pyautogui_step(extract_code(text))]


class ActionRefused(ValueError):
    """A readable action this episode may not take any more (after DONE/FAIL, past the cap)."""


class DesktopSession:
    def __init__(self, controller: DesktopController, settings: OsworldEnvConfig) -> None:
        self.controller = controller
        self.settings = settings
        #: "DONE" or "FAIL" once the agent said so; None while the task is open.
        self.finished: str | None = None
        self.actions_taken = 0

    async def act(self, step: Step) -> ToolOutput:
        """Take one step; the observation. Raises ActionRefused."""
        if self.finished is not None:
            raise ActionRefused(f"the task is over: the agent answered {self.finished}")
        if step.answer is not None:
            if step.answer != "WAIT":
                self.finished = step.answer
                return ToolOutput(
                    f"{self.finished} recorded: the task is over, the desktop is scored now"
                )
            return await self.observe()
        if self.actions_taken >= self.settings.max_actions:
            raise ActionRefused(
                f"{self.settings.max_actions} actions taken (env.osworld.max_actions); answer "
                "DONE or FAIL"
            )
        self.actions_taken += 1
        result = await self.controller.execute_python(step.code)
        observation = await self.observe()
        if not result.ok:
            refused = f"error: the controller refused the action: {result.error}\n"
            return ToolOutput(refused + observation.text, observation.images)
        return observation

    async def tree(self) -> list[Node]:
        return parse_tree(await self.controller.accessibility_tree())

    async def observe(self) -> ToolOutput:
        kind = self.settings.observation_type
        text = await self.tree_text() if kind in ("a11y_tree", "screenshot_a11y_tree") else ""
        return ToolOutput(text, await self.screenshots())

    async def screenshots(self) -> tuple[bytes, ...]:
        """The screen as the observation type shows it: one PNG, or none (``a11y_tree``)."""
        if self.settings.observation_type == "a11y_tree":
            return ()
        return (await self.controller.screenshot(),)

    async def tree_text(self) -> str:
        text = linearize(await self.tree())
        limit = self.settings.max_observation_chars
        if len(text) > limit:
            return text[:limit] + f"\n[observation cut at {limit} characters]"
        return text
