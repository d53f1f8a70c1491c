"""OSWorld-shaped tasks for the simulated desktop, read strictly.

A task is OSWorld's JSON shape, cut to what the simulator implements::

    {"id": "...", "instruction": "...",
     "config": [{"type": "desktop", "parameters": {"screen": [640, 400], "widgets": [...]}}],
     "evaluator": {"func": "check_accessibility_tree",
                   "result": {"type": "accessibility_tree"},
                   "expected": {"type": "rule", "rules": [{"name": "Name", "text": "Ada"}]}}}

``config`` is the setup (OSWorld's list of setup steps; here the one step ``desktop`` lays out
the widgets), ``evaluator`` names a getter (``result``) and a metric (``func``) applied to the
final state. ``func: infeasible`` is OSWorld's infeasible task: solved only by answering FAIL.
Every field is checked when the task is read; a bad task is the data's fault (the group is
refused with the reason), never a zero reward for the model.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_WIDGETS = 32
MAX_SCREEN = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class OnPress(_Strict):
    """What a button does when pressed: set the text of another widget."""

    target: str = Field(min_length=1)
    text: str = Field(max_length=200)


class WidgetSpec(_Strict):
    type: Literal["text_field", "button", "checkbox", "menu", "label"]
    name: str = Field(min_length=1, max_length=64)
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    width: int = Field(gt=0)
    height: int = Field(gt=0)
    text: str = Field("", max_length=200)
    checked: bool = False
    options: tuple[str, ...] = ()
    selected: str | None = None
    on_press: OnPress | None = None

    @model_validator(mode="after")
    def _fits_its_kind(self) -> WidgetSpec:
        if (self.type == "menu") != bool(self.options):
            raise ValueError(f"widget {self.name!r}: options are for menus, and a menu needs them")
        if self.selected is not None and self.selected not in self.options:
            raise ValueError(f"widget {self.name!r}: selected {self.selected!r} is no option")
        if self.on_press is not None and self.type != "button":
            raise ValueError(f"widget {self.name!r}: on_press is for buttons")
        if self.checked and self.type != "checkbox":
            raise ValueError(f"widget {self.name!r}: checked is for checkboxes")
        return self


class DesktopSpec(_Strict):
    screen: tuple[int, int] = (640, 400)
    widgets: tuple[WidgetSpec, ...] = Field(min_length=1, max_length=MAX_WIDGETS)

    @model_validator(mode="after")
    def _consistent(self) -> DesktopSpec:
        width, height = self.screen
        if not (0 < width <= MAX_SCREEN and 0 < height <= MAX_SCREEN):
            raise ValueError(f"screen {self.screen} is outside 1..{MAX_SCREEN}")
        names = [widget.name for widget in self.widgets]
        if len(set(names)) != len(names):
            raise ValueError("widget names must be unique (the evaluator finds widgets by name)")
        for widget in self.widgets:
            if widget.x + widget.width > width or widget.y + widget.height > height:
                raise ValueError(f"widget {widget.name!r} is off the {width}x{height} screen")
            if widget.on_press is not None and widget.on_press.target not in names:
                raise ValueError(f"widget {widget.name!r}: on_press targets no widget")
        return self


class SetupStep(_Strict):
    type: Literal["desktop"]
    parameters: DesktopSpec


class WidgetRule(_Strict):
    """The named widget's final state: each given attribute must equal its value."""

    name: str = Field(min_length=1)
    text: str | None = None
    checked: bool | None = None


class Expected(_Strict):
    type: Literal["rule"] = "rule"
    rules: tuple[WidgetRule, ...] = ()


class Getter(_Strict):
    type: Literal["accessibility_tree"] = "accessibility_tree"


class Evaluator(_Strict):
    func: Literal["check_accessibility_tree", "infeasible"]
    result: Getter = Field(default_factory=Getter)
    expected: Expected = Field(default_factory=Expected)

    @model_validator(mode="after")
    def _has_rules(self) -> Evaluator:
        if self.func == "check_accessibility_tree" and not self.expected.rules:
            raise ValueError("check_accessibility_tree needs expected.rules")
        return self


class DesktopTask(_Strict):
    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    config: tuple[SetupStep, ...] = Field(min_length=1, max_length=1)
    evaluator: Evaluator

    @property
    def desktop(self) -> DesktopSpec:
        return self.config[0].parameters

    @model_validator(mode="after")
    def _rules_name_widgets(self) -> DesktopTask:
        names = {widget.name for widget in self.desktop.widgets}
        for rule in self.evaluator.expected.rules:
            if rule.name not in names:
                raise ValueError(f"evaluator rule names no widget: {rule.name!r}")
        return self


class TaskError(ValueError):
    """The task cannot be used; ``reason`` is a stable code for the dead letter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def parse_setup(raw: object) -> SetupStep:
    """A task's ``config`` on its own (what the simulator's ``POST /desktops`` carries)."""
    if not isinstance(raw, list) or len(raw) != 1:
        raise TaskError("bad_task", "config must be a list of one setup step")
    try:
        return SetupStep.model_validate(_lists_as_tuples(raw[0]))
    except RecursionError:
        raise TaskError("bad_task", "the setup is nested too deeply") from None
    except ValidationError as error:
        raise TaskError("bad_task", _first_error("config.0", error)) from None


def _first_error(prefix: str, error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join([prefix, *(str(part) for part in first["loc"])]).strip(".")
    return f"task field {where or '(root)'}: {first['msg']}"


def parse_task(raw: object) -> DesktopTask:
    """A task from its JSON text (as records carry it) or an already-decoded object."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError) as error:  # nesting past the parser's depth
            raise TaskError("bad_task", f"the task is not JSON: {error!r}") from None
    if not isinstance(raw, dict):
        raise TaskError("missing_task", "the record carries no desktop task (metadata 'task')")
    try:
        return DesktopTask.model_validate(_lists_as_tuples(raw))
    except RecursionError:
        raise TaskError("bad_task", "the task is nested too deeply") from None
    except ValidationError as error:
        raise TaskError("bad_task", _first_error("", error)) from None


def _lists_as_tuples(value: Any) -> Any:
    # JSON has lists; strict pydantic wants the declared tuples.
    if isinstance(value, list):
        return tuple(_lists_as_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: _lists_as_tuples(item) for key, item in value.items()}
    return value
