"""OSWorld's ``computer_13`` action space: structured JSON actions, read strictly.

OSWorld's other action space (``action_space="computer_13"``, ``desktop_env/actions.py``):
each action is a JSON object ``{"action_type": T, ...parameters}`` — or with the parameters
nested, ``{"action_type": T, "parameters": {...}}``; OSWorld's controller takes both — of one of
sixteen types (:data:`ACTION_TYPES`, each with OSWorld's parameters, types, ranges and optional
flags), or one of the bare answers ``WAIT`` / ``DONE`` / ``FAIL``. :func:`parse_action` refuses,
with its reason, an unknown type, a missing, extra, mistyped or out-of-range parameter and an
unknown key (:class:`.actions.ActionParseError`, the same error the ``pyautogui`` space raises).

OSWorld runs these actions as ``pyautogui`` commands through the VM controller's ``/execute``
(``PythonController.execute_action``), one command per action; :func:`to_pyautogui` writes the
same command, so one client drives a real VM and the simulator alike. Differences, all timing
or formatting, never the outcome: ``MOVE_TO`` is sent without OSWorld's random duration and
easing; coordinates are rounded to whole pixels (OSWorld passes the floats on); strings are
quoted with :func:`repr` (OSWorld pastes keys between quotes, which breaks on ``'``). ``SCROLL``
takes ``clicks`` as the action space defines it and is sent as ``pyautogui.scroll(clicks)``
(OSWorld's controller reads ``dx`` / ``dy`` instead, which its own action space never offers).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dockyard.environments.osworld.actions import (
    MAX_STATEMENTS,
    MAX_TEXT_CHARS,
    SPECIAL_CODES,
    ActionParseError,
    extract_code,
)
from dockyard.environments.osworld.keys import COMPUTER_13_KEYS

#: OSWorld's screen bounds for coordinates (its X_MAX / Y_MAX), inclusive.
X_MAX = 1920
Y_MAX = 1080
BUTTONS = ("left", "right", "middle")
NUM_CLICKS = (1, 2, 3)
_JSON_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)

Value = float | int | str | tuple[str, ...]


def _coordinate(bound: int) -> Callable[[str, object], Value]:
    def check(name: str, value: object) -> Value:
        # OSWorld types coordinates as float; a JSON integer is a float too. Not a bool.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ActionParseError(f"{name} must be a number, got {value!r}")
        if not (math.isfinite(value) and 0 <= value <= bound):
            raise ActionParseError(f"{name}={value!r} is outside [0, {bound}]")
        return value

    return check


def _button(name: str, value: object) -> Value:
    if value not in BUTTONS:
        raise ActionParseError(f"{name} must be one of {', '.join(BUTTONS)}, got {value!r}")
    assert isinstance(value, str)
    return value


def _num_clicks(name: str, value: object) -> Value:
    if isinstance(value, bool) or not isinstance(value, int) or value not in NUM_CLICKS:
        raise ActionParseError(f"{name} must be the integer 1, 2 or 3, got {value!r}")
    return value


def _clicks(name: str, value: object) -> Value:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionParseError(f"{name} must be an integer, got {value!r}")
    return value


def _text(name: str, value: object) -> Value:
    if not isinstance(value, str):
        raise ActionParseError(f"{name} must be a string, got {value!r}")
    if len(value) > MAX_TEXT_CHARS:
        raise ActionParseError(f"{name} has {len(value)} characters; at most {MAX_TEXT_CHARS}")
    return value


def _key(name: str, value: object) -> Value:
    # OSWorld's controller checks key.lower() against KEYBOARD_KEYS and sends the key as given.
    if not isinstance(value, str) or value.lower() not in COMPUTER_13_KEYS:
        raise ActionParseError(f"{name}: unknown key {value!r} (OSWorld's KEYBOARD_KEYS)")
    return value


def _keys(name: str, value: object) -> Value:
    if not isinstance(value, list) or not value:
        raise ActionParseError(f"{name} must be a non-empty list of keys, got {value!r}")
    return tuple(str(_key(name, key)) for key in value)


@dataclass(frozen=True)
class Param:
    check: Callable[[str, object], Value]
    optional: bool


_X = Param(_coordinate(X_MAX), optional=False)
_Y = Param(_coordinate(Y_MAX), optional=False)
_AT = {"x": Param(_X.check, optional=True), "y": Param(_Y.check, optional=True)}
_BUTTON = {"button": Param(_button, optional=True)}
_KEY = {"key": Param(_key, optional=False)}

#: OSWorld's ACTION_SPACE: each action type's parameters (what ``desktop_env/actions.py`` says).
ACTION_TYPES: dict[str, dict[str, Param]] = {
    "MOVE_TO": {"x": _X, "y": _Y},
    "CLICK": {**_BUTTON, **_AT, "num_clicks": Param(_num_clicks, optional=True)},
    "MOUSE_DOWN": _BUTTON,
    "MOUSE_UP": _BUTTON,
    "RIGHT_CLICK": _AT,
    "DOUBLE_CLICK": _AT,
    "DRAG_TO": {"x": _X, "y": _Y},
    "SCROLL": {"clicks": Param(_clicks, optional=False)},
    "TYPING": {"text": Param(_text, optional=False)},
    "PRESS": _KEY,
    "KEY_DOWN": _KEY,
    "KEY_UP": _KEY,
    "HOTKEY": {"keys": Param(_keys, optional=False)},
    "WAIT": {},
    "FAIL": {},
    "DONE": {},
}


@dataclass(frozen=True)
class Computer13Action:
    action_type: str
    parameters: Mapping[str, Value] = field(default_factory=dict)

    @property
    def answer(self) -> str | None:
        """``WAIT`` / ``DONE`` / ``FAIL`` for the agent's answers; None for a desktop action."""
        return self.action_type if self.action_type in SPECIAL_CODES else None


def parse_action(value: object) -> Computer13Action:
    """One action (a JSON value already decoded); :class:`ActionParseError` says what is wrong."""
    if isinstance(value, str) and value in SPECIAL_CODES:
        return Computer13Action(value)  # OSWorld's bare answers
    if not isinstance(value, dict):
        raise ActionParseError(f'an action is a JSON object {{"action_type": ...}}, not {value!r}')
    action_type = value.get("action_type")
    if not isinstance(action_type, str) or action_type not in ACTION_TYPES:
        known = ", ".join(ACTION_TYPES)
        raise ActionParseError(f"unknown action_type {action_type!r} (one of {known})")
    rest = {name: item for name, item in value.items() if name != "action_type"}
    if "parameters" in rest:
        if len(rest) > 1:
            extra = ", ".join(sorted(set(rest) - {"parameters"}))
            raise ActionParseError(f"{action_type}: parameters nested and beside it ({extra})")
        rest = rest["parameters"]
        if not isinstance(rest, dict):
            raise ActionParseError(f"{action_type}: parameters must be a JSON object")
    spec = ACTION_TYPES[action_type]
    unknown = sorted(set(rest) - set(spec))
    if unknown:
        allowed = ", ".join(spec) or "none"
        raise ActionParseError(
            f"{action_type}: unknown parameter {', '.join(unknown)} (allowed: {allowed})"
        )
    missing = [name for name, param in spec.items() if not param.optional and name not in rest]
    if missing:
        raise ActionParseError(f"{action_type}: missing {', '.join(missing)}")
    if ("x" in rest) != ("y" in rest):
        raise ActionParseError(f"{action_type}: give both x and y, or neither")
    parameters = {name: spec[name].check(name, item) for name, item in rest.items()}
    return Computer13Action(action_type, parameters)


def parse_response(response: str) -> list[Computer13Action]:
    """A single-turn response's actions: its last fenced block (```json or ```), else the whole
    text — ``WAIT`` / ``DONE`` / ``FAIL``, an action object, or a list of them (OSWorld's
    ``parse_actions_from_string``)."""
    text = extract_code(response, _JSON_FENCE).strip()
    if not text:
        raise ActionParseError("no action: the response is empty")
    if text in SPECIAL_CODES:
        return [Computer13Action(text)]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ActionParseError(f"not JSON: {error.msg} (line {error.lineno})") from None
    except RecursionError:
        raise ActionParseError("not JSON: nested too deeply") from None
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ActionParseError("no action: the list is empty")
    if len(values) > MAX_STATEMENTS:
        raise ActionParseError(f"{len(values)} actions; at most {MAX_STATEMENTS}")
    return [parse_action(item) for item in values]


def _pixel(value: Value) -> int:
    assert isinstance(value, int | float)
    return round(value)


def _call(function: str, *args: str, **kwargs: Value) -> str:
    named = []
    for name, value in kwargs.items():
        named.append(f"{name}={_pixel(value) if name in ('x', 'y') else repr(value)}")
    return f"pyautogui.{function}({', '.join([*args, *named])})"


def to_pyautogui(action: Computer13Action) -> str:
    """The pyautogui command OSWorld's controller sends for ``action`` (not for an answer)."""
    kind, params = action.action_type, dict(action.parameters)
    if kind == "MOVE_TO":
        return f"pyautogui.moveTo({_pixel(params['x'])}, {_pixel(params['y'])})"
    if kind == "CLICK":
        if "num_clicks" in params:
            params["clicks"] = params.pop("num_clicks")
        return _call("click", **params)
    if kind in ("MOUSE_DOWN", "MOUSE_UP"):
        return _call("mouseDown" if kind == "MOUSE_DOWN" else "mouseUp", **params)
    if kind in ("RIGHT_CLICK", "DOUBLE_CLICK"):
        return _call("rightClick" if kind == "RIGHT_CLICK" else "doubleClick", **params)
    if kind == "DRAG_TO":
        x, y = _pixel(params["x"]), _pixel(params["y"])
        return f"pyautogui.dragTo({x}, {y}, duration=1.0, button='left', mouseDownUp=True)"
    if kind == "SCROLL":
        return f"pyautogui.scroll({params['clicks']!r})"
    if kind == "TYPING":
        return f"pyautogui.typewrite({params['text']!r})"
    if kind in ("PRESS", "KEY_DOWN", "KEY_UP"):
        function = {"PRESS": "press", "KEY_DOWN": "keyDown", "KEY_UP": "keyUp"}[kind]
        return f"pyautogui.{function}({params['key']!r})"
    if kind == "HOTKEY":
        keys = params["keys"]
        assert isinstance(keys, tuple)
        return f"pyautogui.hotkey({', '.join(map(repr, keys))})"
    raise ValueError(f"{kind} is the agent's answer, not a command for the controller")
