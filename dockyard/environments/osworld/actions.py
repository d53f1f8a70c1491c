"""OSWorld's ``pyautogui`` action space, read safely: parsed with :mod:`ast`, never executed.

An OSWorld agent answers each screenshot with Python that drives ``pyautogui`` (OSWorld's
``action_space="pyautogui"``), or with one of the special codes ``WAIT``, ``DONE`` and ``FAIL``.
Here that code is *read*, not run: :func:`parse_actions` accepts only a whitelist of calls —
``pyautogui.click / doubleClick / rightClick / moveTo / dragTo / mouseDown / mouseUp / write /
typewrite / press / keyDown / keyUp / hotkey / scroll`` and ``time.sleep`` — with literal
arguments, plus the ``import pyautogui`` / ``import time`` lines agents write before them.
Anything else (a name, an attribute chain, an expression as an argument, ``__import__('os')``, a
loop) is refused with its reason, so a model can move the pointer and type but never reach the
interpreter. The ``computer_13`` space (:mod:`.computer13`) is translated into these calls.

The same reader serves the agent's tool, the simulator's ``/execute`` and the scorer's replay,
so all three agree on what an action is.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass

from dockyard.environments.osworld.keys import COMPUTER_13_KEYS

#: Keys ``press`` / ``hotkey`` / ``keyDown`` / ``keyUp`` accept (pyautogui's names, lower case):
#: OSWorld's KEYBOARD_KEYS, which every translated ``computer_13`` action names, plus ``space``
#: (pyautogui has it, OSWorld's copy of the list does not). A typo is refused, not sent.
KEYS = COMPUTER_13_KEYS | {"space"}
SPECIAL_CODES = ("WAIT", "DONE", "FAIL")
#: The longest pause ``time.sleep`` may ask for (a simulated desktop has nothing to wait for,
#: and a real one should not be held by a model's whim).
MAX_SLEEP_S = 5.0
MAX_TEXT_CHARS = 2_000
MAX_STATEMENTS = 32


class ActionParseError(ValueError):
    """The code is not an action this space allows; the message says why (the model reads it)."""


@dataclass(frozen=True)
class Click:
    x: int | None  # None: where the pointer is
    y: int | None
    button: str = "left"
    clicks: int = 1


@dataclass(frozen=True)
class MoveTo:
    x: int
    y: int


@dataclass(frozen=True)
class Write:
    text: str


@dataclass(frozen=True)
class Press:
    keys: tuple[str, ...]  # pressed one after another
    presses: int = 1


@dataclass(frozen=True)
class Hotkey:
    keys: tuple[str, ...]  # held together


@dataclass(frozen=True)
class Scroll:
    clicks: int
    x: int | None = None
    y: int | None = None


@dataclass(frozen=True)
class MouseButton:
    """``mouseDown`` / ``mouseUp``: one button pressed or released (after moving to x, y)."""

    down: bool
    button: str = "left"
    x: int | None = None  # None: where the pointer is
    y: int | None = None


@dataclass(frozen=True)
class DragTo:
    """``dragTo``: press ``button`` where the pointer is, move to (x, y), release."""

    x: int
    y: int
    button: str = "left"


@dataclass(frozen=True)
class Key:
    """``keyDown`` / ``keyUp``: one key pressed (and held) or released."""

    key: str
    down: bool


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Special:
    code: str  # one of SPECIAL_CODES


Action = (
    Click | MoveTo | Write | Press | Hotkey | Scroll | MouseButton | DragTo | Key | Sleep | Special
)

# Each allowed call: its parameters in positional order (pyautogui's own order) and which are
# required. Parameters pyautogui has but a simulated desktop has no use for (``interval``,
# ``duration``, ``tween``) are accepted and ignored: they change timing, not the outcome.
_TIMING = ("interval", "duration", "tween", "logScreenshot", "_pause")
_SIGNATURES: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "click": (("x", "y", "clicks", "interval", "button", "duration"), frozenset()),
    "doubleClick": (("x", "y", "interval", "button", "duration"), frozenset()),
    "rightClick": (("x", "y", "duration"), frozenset()),
    "moveTo": (("x", "y", "duration"), frozenset({"x", "y"})),
    "write": (("message", "interval"), frozenset({"message"})),
    "typewrite": (("message", "interval"), frozenset({"message"})),
    "press": (("keys", "presses", "interval"), frozenset({"keys"})),
    "scroll": (("clicks", "x", "y"), frozenset({"clicks"})),
    "mouseDown": (("x", "y", "button", "duration", "tween"), frozenset()),
    "mouseUp": (("x", "y", "button", "duration", "tween"), frozenset()),
    "dragTo": (
        ("x", "y", "duration", "tween", "button", "logScreenshot", "_pause", "mouseDownUp"),
        frozenset({"x", "y"}),
    ),
    "keyDown": (("key",), frozenset({"key"})),
    "keyUp": (("key",), frozenset({"key"})),
}
_BUTTONS = ("left", "right", "middle")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response: str, fence: re.Pattern[str] = _FENCE) -> str:
    """The code of a response: its last ``fence`` block, else the whole text (OSWorld's reader).
    The default fence is Python's; the ``computer_13`` space passes its JSON fence."""
    blocks = fence.findall(response)
    return blocks[-1] if blocks else response


def parse_actions(code: str) -> list[Action]:
    """The actions ``code`` stands for, in order; :class:`ActionParseError` for anything else."""
    stripped = code.strip()
    if stripped in SPECIAL_CODES:
        return [Special(stripped)]
    if not stripped:
        raise ActionParseError("no action: the code is empty")
    try:
        tree = ast.parse(stripped, mode="exec")
    except SyntaxError as error:
        raise ActionParseError(f"not Python: {error.msg} (line {error.lineno})") from None
    if len(tree.body) > MAX_STATEMENTS:
        raise ActionParseError(f"{len(tree.body)} statements; at most {MAX_STATEMENTS}")
    actions: list[Action] = []
    for statement in tree.body:
        action = _statement(statement)
        if action is not None:
            actions.append(action)
    if not actions:
        raise ActionParseError("no action: only imports")
    return actions


def _statement(node: ast.stmt) -> Action | None:
    if isinstance(node, ast.Import):
        names = {alias.name for alias in node.names if alias.asname is None}
        if len(names) == len(node.names) and names <= {"pyautogui", "time"}:
            return None
        raise ActionParseError("only 'import pyautogui' and 'import time' are allowed")
    if isinstance(node, ast.Assign) and _is_failsafe_off(node):
        return None  # OSWorld's controller prefix: pyautogui.FAILSAFE = False
    expression = node.value if isinstance(node, ast.Expr) else None
    if isinstance(expression, ast.Name) and expression.id in SPECIAL_CODES:
        return Special(expression.id)
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        raise ActionParseError(
            f"line {node.lineno}: only pyautogui calls are allowed, not {type(node).__name__}"
        )
    return _call(node.value)


def _is_failsafe_off(node: ast.Assign) -> bool:
    target = node.targets[0] if len(node.targets) == 1 else None
    return (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and (target.value.id, target.attr) == ("pyautogui", "FAILSAFE")
        and isinstance(node.value, ast.Constant)
        and node.value.value is False
    )


def _call(call: ast.Call) -> Action:
    function = call.func
    if not (isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name)):
        raise ActionParseError(f"line {call.lineno}: call pyautogui.<function> directly")
    module, name = function.value.id, function.attr
    if (module, name) == ("time", "sleep"):
        seconds = _bind(call, ("seconds",), frozenset({"seconds"}))["seconds"]
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
            raise ActionParseError("time.sleep needs a non-negative number of seconds")
        if seconds > MAX_SLEEP_S:
            raise ActionParseError(f"time.sleep({seconds}) is over {MAX_SLEEP_S:g} seconds")
        return Sleep(float(seconds))
    if module != "pyautogui":
        raise ActionParseError(f"line {call.lineno}: {module}.{name} is not allowed")
    if name == "hotkey":
        if call.keywords:
            raise ActionParseError("pyautogui.hotkey takes the keys only, as strings")
        return Hotkey(_keys([_literal(arg) for arg in call.args], "hotkey"))
    if name not in _SIGNATURES:
        allowed = ", ".join(sorted([*_SIGNATURES, "hotkey"]))
        raise ActionParseError(f"pyautogui.{name} is not allowed (allowed: {allowed})")
    params, required = _SIGNATURES[name]
    return _action(name, _bind(call, params, required))


def _action(name: str, args: dict[str, object]) -> Action:
    if name in ("click", "doubleClick", "rightClick"):
        x, y = _point(args, optional=True)
        button = "right" if name == "rightClick" else _button(args.get("button", "left"))
        clicks = 2 if name == "doubleClick" else _int(args.get("clicks", 1), "clicks")
        if not 1 <= clicks <= 3:
            raise ActionParseError("clicks must be 1, 2 or 3")
        return Click(x, y, button, clicks)
    if name == "moveTo":
        x, y = _point(args, optional=False)
        assert x is not None and y is not None
        return MoveTo(x, y)
    if name in ("write", "typewrite"):
        message = args["message"]
        if isinstance(message, list):  # typewrite(['a', 'enter']): keys, one after another
            return Press(_keys(message, name))
        if not isinstance(message, str):
            raise ActionParseError(f"pyautogui.{name} needs a string")
        if len(message) > MAX_TEXT_CHARS:
            raise ActionParseError(f"text of {len(message)} characters; at most {MAX_TEXT_CHARS}")
        return Write(message)
    if name in ("mouseDown", "mouseUp"):
        x, y = _point(args, optional=True)
        return MouseButton(name == "mouseDown", _button(args.get("button", "left")), x, y)
    if name == "dragTo":
        x, y = _point(args, optional=False)
        assert x is not None and y is not None
        down_up = args.get("mouseDownUp", True)
        if not isinstance(down_up, bool):
            raise ActionParseError("pyautogui.dragTo: mouseDownUp must be True or False")
        if not down_up:
            return MoveTo(x, y)  # pyautogui only moves then: no button goes down or up
        return DragTo(x, y, _button(args.get("button", "left")))
    if name in ("keyDown", "keyUp"):
        [key] = _keys([args["key"]], name)
        return Key(key, name == "keyDown")
    if name == "press":
        keys = args["keys"]
        presses = _int(args.get("presses", 1), "presses")
        if not 1 <= presses <= 50:
            raise ActionParseError("presses must be between 1 and 50")
        return Press(_keys(keys if isinstance(keys, list) else [keys], "press"), presses)
    # scroll
    x, y = _point(args, optional=True)
    return Scroll(_int(args["clicks"], "clicks"), x, y)


def _bind(call: ast.Call, params: Sequence[str], required: frozenset[str]) -> dict[str, object]:
    """Arguments by parameter name, as Python would bind them; literals only."""
    if len(call.args) > len(params):
        raise ActionParseError(f"line {call.lineno}: too many arguments")
    bound: dict[str, object] = {}
    for param, arg in zip(params, call.args, strict=False):
        bound[param] = _literal(arg)
    for keyword in call.keywords:
        if keyword.arg is None or keyword.arg not in params:
            raise ActionParseError(f"line {call.lineno}: unexpected argument {keyword.arg!r}")
        if keyword.arg in bound:
            raise ActionParseError(f"line {call.lineno}: {keyword.arg!r} given twice")
        bound[keyword.arg] = _literal(keyword.value)
    missing = required - bound.keys()
    if missing:
        raise ActionParseError(f"line {call.lineno}: missing {', '.join(sorted(missing))}")
    return {name: value for name, value in bound.items() if name not in _TIMING}


def _literal(node: ast.expr) -> object:
    """A constant, a negative number, or a list/tuple of them — never an expression to run."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str | bool):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int | float)
    ):
        return -node.operand.value
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(element) for element in node.elts]
    raise ActionParseError(
        f"line {node.lineno}: arguments must be literals, not {type(node).__name__}"
    )


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ActionParseError(f"{what} must be a whole number, got {value!r}")
    return int(value)


def _point(args: dict[str, object], *, optional: bool) -> tuple[int | None, int | None]:
    x, y = args.get("x"), args.get("y")
    if isinstance(x, list) and y is None and len(x) == 2:  # click((10, 20))
        x, y = x
    if x is None and y is None and optional:
        return None, None
    if x is None or y is None:
        raise ActionParseError("give both x and y")
    return _int(x, "x"), _int(y, "y")


def _button(button: object) -> str:
    if not isinstance(button, str) or button not in _BUTTONS:
        raise ActionParseError(f"button must be one of {', '.join(_BUTTONS)}")
    return button


def _keys(keys: object, what: str) -> tuple[str, ...]:
    if not isinstance(keys, list) or not keys:
        raise ActionParseError(f"pyautogui.{what} needs one or more key names")
    names = []
    for key in keys:
        if not isinstance(key, str) or key.lower() not in KEYS:
            raise ActionParseError(f"pyautogui.{what}: unknown key {key!r}")
        names.append(key.lower())
    return tuple(names)
