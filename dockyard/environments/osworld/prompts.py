"""What an OSWorld task says to the agent: the instruction, the action space (the run's
``env.osworld.action_space``: what a ``computer`` call's arguments are), and the first
observation (the desktop's accessibility tree as text, OSWorld's ``a11y_tree`` observation).
With a screenshot observation type the first observation is the desktop's screenshot instead:
the prompt is a user message with one image part then the text (:func:`screenshot_task_message`),
and the episode shows the desktop's screenshot after the task's setup in that image's place.

The first observation is rendered from the task's own setup (:meth:`.desktop.Desktop.from_spec`
is what the simulator builds too), so a record's prompt is a pure function of its task; the
shipped records are checked against it (tests/unit/environments/test_osworld_tasks.py).
"""

from __future__ import annotations

from dockyard.config.sections.env import OsworldActionSpace
from dockyard.environments.osworld.accessibility import linearize, parse_tree
from dockyard.environments.osworld.computer13 import ACTION_TYPES
from dockyard.environments.osworld.desktop import Desktop
from dockyard.environments.osworld.tasks import DesktopTask

# Short on purpose: the CPU preset's tiny model has a context of 256 tokens. The line tells the
# agent what a `computer` call's arguments are in the run's action space.
ACTION_SPACES: dict[OsworldActionSpace, str] = {
    "pyautogui": 'Act: computer {"action": pyautogui code|DONE|FAIL}',
    "computer_13": 'Act: computer {"action_type": ' + "|".join(ACTION_TYPES) + ", params}",
}


def task_prompt(task: DesktopTask, action_space: OsworldActionSpace = "pyautogui") -> str:
    tree = linearize(parse_tree(Desktop.from_spec(task.desktop).accessibility_tree()))
    return f"Task: {task.instruction}\n{ACTION_SPACES[action_space]}\n{tree}\n"


def screenshot_task_message(
    task: DesktopTask, action_space: OsworldActionSpace = "pyautogui"
) -> dict[str, object]:
    """The user message of a screenshot task (``fields.messages``): the first screenshot's
    image part, then the instruction and the action space."""
    text = f"Task: {task.instruction}\n{ACTION_SPACES[action_space]}\n"
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}
