"""The simulated desktop: a STAND-IN for an OSWorld virtual machine.

Real OSWorld tasks run in a full Ubuntu VM; none can run on this project's machines, so the
simulator service (:mod:`.simulator`) hosts these small desktops instead: text fields, buttons,
checkboxes, drop-down menus and labels laid out by a task's ``config``. It applies the actions of
:mod:`.actions` the way a GUI toolkit would (a click focuses or toggles, typing goes to the
focused field, ``tab`` moves the focus, a menu opens on click and selects an option, a modifier
held down with ``keyDown`` modifies the keys pressed until ``keyUp``, a ``mouseDown`` and
``mouseUp`` on the same target make a click), renders a
screenshot with PIL, and describes itself as an accessibility tree in the XML shape OSWorld's
in-VM server returns (AT-SPI roles, ``st:``/``cp:`` attributes in OSWorld's namespaces), so an
agent and an evaluator written for the real tree read this one too.
"""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from dockyard.environments.osworld.actions import (
    Action,
    Click,
    DragTo,
    Hotkey,
    Key,
    MouseButton,
    MoveTo,
    Press,
    Write,
)
from dockyard.environments.osworld.tasks import DesktopSpec

# OSWorld's namespaces for the accessibility tree's state and component attributes.
STATE_NS = "https://accessibility.ubuntu.example.org/ns/state"
COMPONENT_NS = "https://accessibility.ubuntu.example.org/ns/component"
ET.register_namespace("st", STATE_NS)
ET.register_namespace("cp", COMPONENT_NS)

#: AT-SPI role names (what the real tree's tags are) of the simulated widget kinds.
ROLES = {
    "text_field": "entry",
    "button": "push-button",
    "checkbox": "check-box",
    "menu": "combo-box",
    "label": "label",
}
_FOCUSABLE = ("text_field", "button", "checkbox", "menu")
_MODIFIERS = frozenset(
    {"ctrl", "ctrlleft", "ctrlright", "shift", "shiftleft", "shiftright", "alt", "altleft"}
    | {"altright", "command", "win", "winleft", "winright", "option", "optionleft", "optionright"}
)
_SHIFTS = frozenset({"shift", "shiftleft", "shiftright"})
#: Key names that are another key's alias (pyautogui's own: ``'\n'`` presses enter).
_ALIASES = {"\n": "enter", "\r": "enter", "\t": "tab", " ": "space", "del": "delete"}
_ALIASES |= {"pgup": "pageup", "pgdn": "pagedown"}
MAX_FIELD_CHARS = 200


@dataclass
class Widget:
    kind: str
    name: str
    x: int
    y: int
    width: int
    height: int
    text: str = ""
    checked: bool = False
    options: tuple[str, ...] = ()
    on_press: tuple[str, str] | None = None  # (target widget, text it gets)

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.x + self.width and self.y <= y < self.y + self.height

    def option_at(self, x: int, y: int) -> str | None:
        """The option of this open menu under (x, y): options hang below it, one per height."""
        if not self.x <= x < self.x + self.width:
            return None
        row = (y - self.y - self.height) // self.height
        return self.options[row] if 0 <= row < len(self.options) and y >= self.y else None


@dataclass
class Desktop:
    width: int
    height: int
    widgets: list[Widget]
    pointer: tuple[int, int] = (0, 0)
    focus: int | None = None  # index into widgets
    open_menu: int | None = None
    highlighted: int = 0  # the option of the open menu the arrow keys are on
    select_all: bool = False  # the focused field's text is selected (typing replaces it)
    held: set[str] = field(default_factory=set)  # modifier keys down (keyDown, not yet up)
    #: What the left button went down on (mouseDown), until it comes up.
    pressed_on: tuple[str, int] | None = None

    @classmethod
    def from_spec(cls, spec: DesktopSpec) -> Desktop:
        widgets = [
            Widget(
                kind=w.type,
                name=w.name,
                x=w.x,
                y=w.y,
                width=w.width,
                height=w.height,
                text=(w.selected or "") if w.type == "menu" else w.text,
                checked=w.checked,
                options=w.options,
                on_press=(w.on_press.target, w.on_press.text) if w.on_press else None,
            )
            for w in spec.widgets
        ]
        return cls(spec.screen[0], spec.screen[1], widgets)

    def widget(self, name: str) -> Widget:
        return next(w for w in self.widgets if w.name == name)

    # ---- actions ---------------------------------------------------------------------------

    def apply(self, action: Action) -> None:
        """One action's effect; waits and special codes change nothing on a desktop."""
        if isinstance(action, MoveTo):
            self.pointer = (action.x, action.y)
        elif isinstance(action, Click):
            if action.x is not None and action.y is not None:
                self.pointer = (action.x, action.y)
            if action.button == "left":
                self._click(action.clicks)
        elif isinstance(action, Write):
            for char in action.text:
                self._type(char)
        elif isinstance(action, Press):
            for _ in range(action.presses):
                for key in action.keys:
                    self._stroke(key)
        elif isinstance(action, Hotkey):
            self._hotkey(tuple(_ALIASES.get(key, key) for key in action.keys))
        elif isinstance(action, Key):
            self._key_event(action)
        elif isinstance(action, MouseButton):
            if action.x is not None and action.y is not None:
                self.pointer = (action.x, action.y)
            self._button_event(action.button, down=action.down)
        elif isinstance(action, DragTo):
            self._button_event(action.button, down=True)
            self.pointer = (action.x, action.y)
            self._button_event(action.button, down=False)

    def _stroke(self, key: str) -> None:
        """A key pressed and released, with whatever modifiers are held down."""
        key = _ALIASES.get(key, key)
        if self.held:
            self._hotkey((*sorted(self.held), key))
        else:
            self._key(key)

    def _key_event(self, event: Key) -> None:
        key = _ALIASES.get(event.key, event.key)
        if key in _MODIFIERS:
            if event.down:
                self.held.add(key)
            else:
                self.held.discard(key)
        elif event.down:
            self._stroke(key)  # a key going down is what types it; its release does nothing

    def _target(self) -> tuple[str, int]:
        """What a click at the pointer would hit: an open menu's option (or outside the menu),
        else a widget, else the bare screen."""
        x, y = self.pointer
        if self.open_menu is not None:
            menu = self.widgets[self.open_menu]
            option = menu.option_at(x, y)
            return ("option", menu.options.index(option)) if option is not None else ("off", -1)
        index = next((i for i, w in enumerate(self.widgets) if w.contains(x, y)), -1)
        return ("widget", index)

    def _button_event(self, button: str, *, down: bool) -> None:
        # A press and a release make a click only on the same target, as in GTK: a release
        # elsewhere (a drag off a button) activates nothing. Other buttons do nothing here.
        if button != "left":
            return
        if down:
            self.pressed_on = self._target()
            return
        pressed, self.pressed_on = self.pressed_on, None
        if pressed is not None and pressed == self._target():
            self._click(1)

    def _click(self, clicks: int) -> None:
        x, y = self.pointer
        if self.open_menu is not None:
            # A click while a menu is open chooses an option or closes the menu: either way
            # the click is the menu's (as in GTK), it reaches nothing beneath.
            menu = self.widgets[self.open_menu]
            option = menu.option_at(x, y)
            if option is not None:
                menu.text = option
            self.open_menu = None
            return
        index = next((i for i, w in enumerate(self.widgets) if w.contains(x, y)), None)
        if index is None or self.widgets[index].kind == "label":
            self.focus, self.select_all = None, False
            return
        widget = self.widgets[index]
        self.focus, self.select_all = index, False
        if widget.kind == "text_field":
            self.select_all = clicks >= 2  # double/triple click selects the field's text
        elif widget.kind == "button":
            for _ in range(clicks):
                self._press_button(widget)
        elif widget.kind == "checkbox":
            if clicks % 2:
                widget.checked = not widget.checked
        elif widget.kind == "menu":
            self.open_menu = index
            self.highlighted = max(0, _index(widget.options, widget.text))

    def _press_button(self, button: Widget) -> None:
        if button.on_press is not None:
            target, text = button.on_press
            self.widget(target).text = text

    def _focused(self, kind: str) -> Widget | None:
        if self.focus is None or self.widgets[self.focus].kind != kind:
            return None
        return self.widgets[self.focus]

    def _type(self, char: str) -> None:
        field_ = self._focused("text_field")
        if field_ is None:
            if char == "\n":
                self._key("enter")
            return  # typing with no field focused goes nowhere, as on a real desktop
        if char == "\n":
            return  # a single-line entry
        if self.select_all:
            field_.text, self.select_all = "", False
        if len(field_.text) < MAX_FIELD_CHARS:
            field_.text += char

    def _key(self, key: str) -> None:
        if self.open_menu is not None:
            self._menu_key(key)
            return
        if key == "tab":
            self._move_focus(+1)
        elif key in ("enter", "return"):
            button = self._focused("button")
            if button is not None:
                self._press_button(button)
        elif key == "space":
            box = self._focused("checkbox")
            if box is not None:
                box.checked = not box.checked
            elif self._focused("text_field") is not None:
                self._type(" ")
            elif (button := self._focused("button")) is not None:
                self._press_button(button)
        elif key in ("backspace", "delete"):
            field_ = self._focused("text_field")
            if field_ is not None:
                field_.text = "" if self.select_all else field_.text[:-1]
                self.select_all = False
        elif key == "down" and self._focused("menu") is not None:
            assert self.focus is not None
            self.open_menu = self.focus
        elif len(key) == 1:
            self._type(key)

    def _menu_key(self, key: str) -> None:
        assert self.open_menu is not None
        menu = self.widgets[self.open_menu]
        if key == "down":
            self.highlighted = min(self.highlighted + 1, len(menu.options) - 1)
        elif key == "up":
            self.highlighted = max(self.highlighted - 1, 0)
        elif key in ("enter", "return"):
            menu.text = menu.options[self.highlighted]
            self.open_menu = None
        elif key in ("escape", "esc", "tab"):
            self.open_menu = None

    def _hotkey(self, keys: tuple[str, ...]) -> None:
        chord = set(keys)
        control = chord & {"ctrl", "ctrlleft", "ctrlright", "command"}
        if control and "a" in chord and self._focused("text_field") is not None:
            self.select_all = True
        elif chord & _SHIFTS and "tab" in chord:
            self._move_focus(-1)
        elif len(keys) == 1:
            self._key(keys[0])
        elif len(chord - _SHIFTS) == 1 and len(keys[-1]) == 1 and keys[-1].isalpha():
            self._type(keys[-1].upper())  # shift and a letter: the capital

    def _move_focus(self, step: int) -> None:
        focusable = [i for i, w in enumerate(self.widgets) if w.kind in _FOCUSABLE]
        if not focusable:
            return
        if self.focus not in focusable:
            self.focus = focusable[0 if step > 0 else -1]
        else:
            at = focusable.index(self.focus)
            self.focus = focusable[(at + step) % len(focusable)]
        self.select_all = self.widgets[self.focus].kind == "text_field"  # tab selects, as GTK

    # ---- observations ----------------------------------------------------------------------

    def accessibility_tree(self) -> str:
        """The desktop as OSWorld's ``/accessibility`` returns it (its ``AT`` string)."""
        root = ET.Element("desktop-frame", {"name": "Desktop"})
        window = ET.SubElement(root, "frame", {"name": "Simulated desktop (dockyard stand-in)"})
        for index, widget in enumerate(self.widgets):
            attributes = {
                "name": widget.name,
                f"{{{STATE_NS}}}enabled": "true",
                f"{{{STATE_NS}}}focused": _flag(index == self.focus),
                f"{{{COMPONENT_NS}}}screencoord": f"({widget.x}, {widget.y})",
                f"{{{COMPONENT_NS}}}size": f"({widget.width}, {widget.height})",
            }
            if widget.kind == "checkbox":
                attributes[f"{{{STATE_NS}}}checked"] = _flag(widget.checked)
            if widget.kind == "menu":
                attributes[f"{{{STATE_NS}}}expanded"] = _flag(index == self.open_menu)
            node = ET.SubElement(window, ROLES[widget.kind], attributes)
            node.text = widget.name if widget.kind == "button" else widget.text
            if widget.kind == "menu" and index == self.open_menu:
                for row, option in enumerate(widget.options, start=1):
                    ET.SubElement(
                        node,
                        "menu-item",
                        {
                            "name": option,
                            f"{{{STATE_NS}}}selected": _flag(option == widget.text),
                            f"{{{COMPONENT_NS}}}screencoord": (
                                f"({widget.x}, {widget.y + row * widget.height})"
                            ),
                            f"{{{COMPONENT_NS}}}size": f"({widget.width}, {widget.height})",
                        },
                    ).text = option
        return ET.tostring(root, encoding="unicode")

    def screenshot(self) -> bytes:
        """A PNG of the screen as the widgets look now (PIL's built-in font)."""
        image = Image.new("RGB", (self.width, self.height), (236, 239, 244))
        draw = ImageDraw.Draw(image)
        for index, widget in enumerate(self.widgets):
            box = (widget.x, widget.y, widget.x + widget.width - 1, widget.y + widget.height - 1)
            outline = (38, 99, 235) if index == self.focus else (120, 120, 130)
            if widget.kind == "label":
                draw.text((widget.x + 2, widget.y + 4), widget.text, fill=(20, 20, 20))
                continue
            fill = (210, 214, 222) if widget.kind == "button" else (255, 255, 255)
            draw.rectangle(box, fill=fill, outline=outline, width=2)
            if widget.kind == "checkbox":
                mark = "[x] " if widget.checked else "[ ] "
                draw.text((widget.x + 4, widget.y + 4), mark + widget.name, fill=(20, 20, 20))
            elif widget.kind == "button":
                draw.text((widget.x + 6, widget.y + 4), widget.name, fill=(20, 20, 20))
            else:
                shown = widget.text + (" v" if widget.kind == "menu" else "")
                draw.text((widget.x + 4, widget.y + 4), shown, fill=(20, 20, 20))
        if self.open_menu is not None:
            menu = self.widgets[self.open_menu]
            for row, option in enumerate(menu.options, start=1):
                top = menu.y + row * menu.height
                bottom = min(top + menu.height - 1, self.height - 1)
                selected = row - 1 == self.highlighted
                fill = (191, 219, 254) if selected else (255, 255, 255)
                draw.rectangle((menu.x, top, menu.x + menu.width - 1, bottom), fill=fill)
                draw.text((menu.x + 4, top + 4), option, fill=(20, 20, 20))
        x, y = self.pointer
        draw.polygon([(x, y), (x + 10, y + 4), (x + 4, y + 10)], fill=(0, 0, 0))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _index(options: tuple[str, ...], value: str) -> int:
    return options.index(value) if value in options else -1
