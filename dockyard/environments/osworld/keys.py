"""The key names both action spaces accept: OSWorld's ``KEYBOARD_KEYS``.

OSWorld's ``computer_13`` space (``desktop_env/actions.py``) lists the keys PRESS, KEY_DOWN,
KEY_UP and HOTKEY may name — pyautogui's own key names, as OSWorld copied them (its list has no
``space``: a space is ``' '``). OSWorld's controller checks ``key.lower()`` against it, so the
check here is on the lower-cased name too. The ``pyautogui`` space's reader
(:mod:`.actions`) accepts these plus the few names agents write that OSWorld's copy lacks
(``space``), so every translated ``computer_13`` action reads back in the ``pyautogui`` space.
"""

from __future__ import annotations

#: OSWorld's ``KEYBOARD_KEYS``, in its order.
KEYBOARD_KEYS: tuple[str, ...] = (
    *"\t\n\r !\"#$%&'()*+,-./0123456789:;<=>?@[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~",
    "accept", "add", "alt", "altleft", "altright", "apps", "backspace", "browserback",
    "browserfavorites", "browserforward", "browserhome", "browserrefresh", "browsersearch",
    "browserstop", "capslock", "clear", "convert", "ctrl", "ctrlleft", "ctrlright", "decimal",
    "del", "delete", "divide", "down", "end", "enter", "esc", "escape", "execute",
    "f1", "f10", "f11", "f12", "f13", "f14", "f15", "f16", "f17", "f18", "f19", "f2", "f20",
    "f21", "f22", "f23", "f24", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "final", "fn",
    "hanguel", "hangul", "hanja", "help", "home", "insert", "junja", "kana", "kanji",
    "launchapp1", "launchapp2", "launchmail", "launchmediaselect", "left", "modechange",
    "multiply", "nexttrack", "nonconvert", "num0", "num1", "num2", "num3", "num4", "num5",
    "num6", "num7", "num8", "num9", "numlock", "pagedown", "pageup", "pause", "pgdn", "pgup",
    "playpause", "prevtrack", "print", "printscreen", "prntscrn", "prtsc", "prtscr", "return",
    "right", "scrolllock", "select", "separator", "shift", "shiftleft", "shiftright", "sleep",
    "stop", "subtract", "tab", "up", "volumedown", "volumemute", "volumeup", "win", "winleft",
    "winright", "yen", "command", "option", "optionleft", "optionright",
)  # fmt: skip
COMPUTER_13_KEYS = frozenset(KEYBOARD_KEYS)
