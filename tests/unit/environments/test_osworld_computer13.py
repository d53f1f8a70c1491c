"""OSWorld's ``computer_13`` action space (``desktop_env/actions.py``): every action type reads
with OSWorld's parameters and becomes the pyautogui command OSWorld's controller sends; every
way to break the space's rules (unknown type, missing / extra / mistyped / out-of-range
parameter, unknown key) is refused with its reason. Expected values are OSWorld's definition:
x in [0, 1920], y in [0, 1080], button left/right/middle, num_clicks 1/2/3, keys from
KEYBOARD_KEYS."""

from __future__ import annotations

import pytest

from dockyard.environments.osworld.actions import (
    ActionParseError,
    Click,
    DragTo,
    Hotkey,
    Key,
    MouseButton,
    MoveTo,
    Press,
    Scroll,
    Write,
    parse_actions,
)
from dockyard.environments.osworld.computer13 import (
    Computer13Action,
    parse_action,
    parse_response,
    to_pyautogui,
)


@pytest.mark.parametrize(
    ("action", "read", "command", "pyautogui"),
    [
        (
            {"action_type": "MOVE_TO", "x": 1319.11, "y": 65.06},
            {"x": 1319.11, "y": 65.06},
            "pyautogui.moveTo(1319, 65)",
            MoveTo(1319, 65),
        ),
        ({"action_type": "CLICK"}, {}, "pyautogui.click()", Click(None, None)),
        (
            {"action_type": "CLICK", "button": "right", "x": 10, "y": 20, "num_clicks": 2},
            {"button": "right", "x": 10, "y": 20, "num_clicks": 2},
            "pyautogui.click(button='right', x=10, y=20, clicks=2)",
            Click(10, 20, "right", 2),
        ),
        (
            {"action_type": "CLICK", "x": 1920, "y": 1080},  # the inclusive upper bounds
            {"x": 1920, "y": 1080},
            "pyautogui.click(x=1920, y=1080)",
            Click(1920, 1080),
        ),
        (
            {"action_type": "MOUSE_DOWN"},
            {},
            "pyautogui.mouseDown()",
            MouseButton(True),
        ),
        (
            {"action_type": "MOUSE_UP", "button": "middle"},
            {"button": "middle"},
            "pyautogui.mouseUp(button='middle')",
            MouseButton(False, "middle"),
        ),
        (
            {"action_type": "RIGHT_CLICK", "x": 0, "y": 0},
            {"x": 0, "y": 0},
            "pyautogui.rightClick(x=0, y=0)",
            Click(0, 0, "right"),
        ),
        (
            {"action_type": "DOUBLE_CLICK"},
            {},
            "pyautogui.doubleClick()",
            Click(None, None, "left", 2),
        ),
        (
            {"action_type": "DRAG_TO", "x": 5, "y": 6.5},
            {"x": 5, "y": 6.5},
            "pyautogui.dragTo(5, 6, duration=1.0, button='left', mouseDownUp=True)",
            DragTo(5, 6),
        ),
        (
            {"action_type": "SCROLL", "clicks": -3},
            {"clicks": -3},
            "pyautogui.scroll(-3)",
            Scroll(-3),
        ),
        (
            {"action_type": "TYPING", "text": 'it\'s \\ "Ada"\n'},
            {"text": 'it\'s \\ "Ada"\n'},
            "pyautogui.typewrite('it\\'s \\\\ \"Ada\"\\n')",
            Write('it\'s \\ "Ada"\n'),
        ),
        (
            {"action_type": "PRESS", "key": "Enter"},  # checked lower-cased, as OSWorld does
            {"key": "Enter"},
            "pyautogui.press('Enter')",
            Press(("enter",)),
        ),
        (
            {"action_type": "PRESS", "key": "'"},  # a key OSWorld would paste unquoted
            {"key": "'"},
            'pyautogui.press("\'")',
            Press(("'",)),
        ),
        (
            {"action_type": "KEY_DOWN", "key": "shift"},
            {"key": "shift"},
            "pyautogui.keyDown('shift')",
            Key("shift", down=True),
        ),
        (
            {"action_type": "KEY_UP", "key": "f24"},
            {"key": "f24"},
            "pyautogui.keyUp('f24')",
            Key("f24", down=False),
        ),
        (
            {"action_type": "HOTKEY", "keys": ["ctrl", "a"]},
            {"keys": ("ctrl", "a")},
            "pyautogui.hotkey('ctrl', 'a')",
            Hotkey(("ctrl", "a")),
        ),
    ],
)
def test_each_action_reads_and_becomes_the_controllers_pyautogui_command(
    action, read, command, pyautogui
):
    parsed = parse_action(action)
    assert parsed == Computer13Action(action["action_type"], read)
    assert parsed.answer is None
    assert to_pyautogui(parsed) == command
    # The command is what the simulator's /execute (and a real VM's pyautogui) runs.
    assert parse_actions(command) == [pyautogui]


def test_parameters_may_be_nested_as_osworlds_controller_takes_them():
    nested = {"action_type": "CLICK", "parameters": {"x": 10, "y": 20}}
    assert parse_action(nested) == parse_action({"action_type": "CLICK", "x": 10, "y": 20})


@pytest.mark.parametrize("answer", ["WAIT", "FAIL", "DONE"])
def test_the_answers_are_actions_without_parameters_or_bare_strings(answer):
    assert parse_action({"action_type": answer}).answer == answer
    assert parse_action(answer).answer == answer
    with pytest.raises(ValueError, match="answer"):
        to_pyautogui(parse_action(answer))


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ({"action_type": "CLICK_AT", "x": 1, "y": 1}, "unknown action_type 'CLICK_AT'"),
        ({"action_type": "click"}, "unknown action_type 'click'"),
        ({"x": 1, "y": 1}, "unknown action_type None"),
        ("CLICK", "an action is a JSON object"),
        (["MOVE_TO"], "an action is a JSON object"),
        ({"action_type": "MOVE_TO", "x": 1}, "MOVE_TO: missing y"),
        ({"action_type": "DRAG_TO"}, "DRAG_TO: missing x, y"),
        ({"action_type": "SCROLL"}, "SCROLL: missing clicks"),
        ({"action_type": "TYPING"}, "TYPING: missing text"),
        ({"action_type": "PRESS"}, "PRESS: missing key"),
        ({"action_type": "HOTKEY"}, "HOTKEY: missing keys"),
        ({"action_type": "SCROLL", "dy": 3}, "SCROLL: unknown parameter dy"),
        ({"action_type": "CLICK", "clicks": 2}, "CLICK: unknown parameter clicks"),
        ({"action_type": "DONE", "x": 1, "y": 1}, "DONE: unknown parameter x, y"),
        ({"action_type": "RIGHT_CLICK", "button": "left"}, "unknown parameter button"),
        ({"action_type": "CLICK", "x": 10}, "give both x and y"),
        ({"action_type": "DOUBLE_CLICK", "y": 10}, "give both x and y"),
        ({"action_type": "MOVE_TO", "x": -1, "y": 0}, "x=-1 is outside [0, 1920]"),
        ({"action_type": "MOVE_TO", "x": 1920.5, "y": 0}, "x=1920.5 is outside [0, 1920]"),
        ({"action_type": "CLICK", "x": 0, "y": 1081}, "y=1081 is outside [0, 1080]"),
        ({"action_type": "MOVE_TO", "x": "10", "y": 0}, "x must be a number"),
        ({"action_type": "MOVE_TO", "x": True, "y": 0}, "x must be a number"),
        ({"action_type": "MOVE_TO", "x": float("nan"), "y": 0}, "outside"),
        ({"action_type": "CLICK", "num_clicks": 4}, "num_clicks must be the integer 1, 2 or 3"),
        ({"action_type": "CLICK", "num_clicks": 2.0}, "num_clicks must be the integer"),
        ({"action_type": "CLICK", "button": "wheel"}, "button must be one of left, right"),
        ({"action_type": "MOUSE_DOWN", "button": "LEFT"}, "button must be one of"),
        ({"action_type": "SCROLL", "clicks": 1.5}, "clicks must be an integer"),
        ({"action_type": "SCROLL", "clicks": False}, "clicks must be an integer"),
        ({"action_type": "TYPING", "text": 42}, "text must be a string"),
        ({"action_type": "TYPING", "text": "x" * 2001}, "2001 characters; at most 2000"),
        ({"action_type": "PRESS", "key": "space"}, "unknown key 'space'"),  # not in OSWorld's
        ({"action_type": "PRESS", "key": "enterr"}, "unknown key 'enterr'"),
        ({"action_type": "KEY_DOWN", "key": "ctrl+a"}, "unknown key 'ctrl+a'"),
        ({"action_type": "KEY_UP", "key": ["ctrl"]}, "unknown key"),
        ({"action_type": "HOTKEY", "keys": "ctrl+a"}, "keys must be a non-empty list"),
        ({"action_type": "HOTKEY", "keys": []}, "keys must be a non-empty list"),
        ({"action_type": "HOTKEY", "keys": ["ctrl", "kanji2"]}, "unknown key 'kanji2'"),
        (
            {"action_type": "CLICK", "parameters": {"x": 1, "y": 1}, "button": "left"},
            "parameters nested and beside it (button)",
        ),
        ({"action_type": "CLICK", "parameters": [1, 1]}, "parameters must be a JSON object"),
    ],
)
def test_anything_outside_the_space_is_refused_with_its_reason(action, reason):
    with pytest.raises(ActionParseError) as refused:
        parse_action(action)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    ("response", "types"),
    [
        ('```json\n{"action_type": "CLICK", "x": 1, "y": 2}\n```', ["CLICK"]),
        ('I click.\n```\n{"action_type": "CLICK"}\n```\nthen ```json\n"DONE"\n```', ["DONE"]),
        ('[{"action_type": "TYPING", "text": "a"}, {"action_type": "DONE"}]', ["TYPING", "DONE"]),
        (' {"action_type": "WAIT"} ', ["WAIT"]),
        ("FAIL", ["FAIL"]),
    ],
)
def test_a_single_turn_response_is_its_last_fenced_block_or_its_text(response, types):
    assert [action.action_type for action in parse_response(response)] == types


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("", "no action: the response is empty"),
        ("```json\n\n```", "no action: the response is empty"),
        ("I would click the box", "not JSON"),
        ("pyautogui.click(1, 2)", "not JSON"),
        ("[]", "no action: the list is empty"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        (str([{"action_type": "WAIT"}] * 33).replace("'", '"'), "33 actions; at most 32"),
        ('[{"action_type": "WAIT"}, {"action_type": "JUMP"}]', "unknown action_type 'JUMP'"),
        ("42", "an action is a JSON object"),
    ],
)
def test_a_response_that_is_not_actions_is_refused(response, reason):
    with pytest.raises(ActionParseError) as refused:
        parse_response(response)
    assert reason in str(refused.value)
