"""OSWorld's pyautogui action space, read with ast and a whitelist: valid code becomes actions,
anything else is refused with a reason — hostile code included — and nothing is ever run."""

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
    Sleep,
    Special,
    Write,
    extract_code,
    parse_actions,
)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("pyautogui.click(10, 20)", [Click(10, 20)]),
        ("pyautogui.click(x=10, y=20, button='right')", [Click(10, 20, "right")]),
        ("pyautogui.click()", [Click(None, None)]),
        ("pyautogui.click((5, 6))", [Click(5, 6)]),
        ("pyautogui.doubleClick(3, 4)", [Click(3, 4, "left", 2)]),
        ("pyautogui.rightClick(3, 4)", [Click(3, 4, "right")]),
        ("pyautogui.moveTo(7, 8, duration=0.5)", [MoveTo(7, 8)]),
        ("pyautogui.write('Ada', interval=0.1)", [Write("Ada")]),
        ("pyautogui.typewrite('hi')", [Write("hi")]),
        ("pyautogui.typewrite(['a', 'enter'])", [Press(("a", "enter"))]),
        ("pyautogui.press('Enter')", [Press(("enter",))]),
        ("pyautogui.press(['tab', 'tab'], presses=2)", [Press(("tab", "tab"), 2)]),
        ("pyautogui.hotkey('ctrl', 'a')", [Hotkey(("ctrl", "a"))]),
        ("pyautogui.scroll(-3)", [Scroll(-3)]),
        ("time.sleep(0.5)", [Sleep(0.5)]),
        # The calls OSWorld's controller sends for computer_13's mouse and key actions.
        ("pyautogui.mouseDown()", [MouseButton(True)]),
        ("pyautogui.mouseUp(5, 6, button='right')", [MouseButton(False, "right", 5, 6)]),
        (
            "pyautogui.dragTo(5, 6, duration=1.0, button='left', mouseDownUp=True)",
            [DragTo(5, 6)],
        ),
        ("pyautogui.dragTo(5, 6, mouseDownUp=False)", [MoveTo(5, 6)]),  # a move, no button
        ("pyautogui.keyDown('Shift')", [Key("shift", down=True)]),
        ("pyautogui.keyUp('ctrl')", [Key("ctrl", down=False)]),
        ("pyautogui.press('pgdn')", [Press(("pgdn",))]),  # OSWorld's KEYBOARD_KEYS
        ("DONE", [Special("DONE")]),
        (" FAIL \n", [Special("FAIL")]),
        ("WAIT", [Special("WAIT")]),
        # What OSWorld's controller sends: its prefix, then the agent's code.
        (
            "import pyautogui; import time; pyautogui.FAILSAFE = False; pyautogui.click(1, 2)",
            [Click(1, 2)],
        ),
        (
            "import pyautogui\npyautogui.click(1, 2)\npyautogui.write('x')",
            [Click(1, 2), Write("x")],
        ),
    ],
)
def test_valid_code_reads_as_its_actions(code, expected):
    assert parse_actions(code) == expected


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("", "empty"),
        ("click here please", "not Python"),
        ("import pyautogui", "only imports"),
        ("pyautogui.click(10)", "both x and y"),
        ("pyautogui.click(1, 2, 3, 4, 5, 6, 7)", "too many arguments"),
        ("pyautogui.click(1, 2, colour='red')", "unexpected argument"),
        ("pyautogui.click(1.5, 2)", "whole number"),
        ("pyautogui.click(True, 2)", "whole number"),
        ("pyautogui.click(1, 2, button='left', button='left')", "given twice"),
        ("pyautogui.press('nosuchkey')", "unknown key"),
        ("pyautogui.press('a', presses=1000)", "between 1 and 50"),
        ("pyautogui.write(42)", "needs a string"),
        ("pyautogui.write('" + "x" * 3000 + "')", "at most"),
        ("time.sleep(3600)", "over 5"),
        ("pyautogui.screenshot()", "not allowed"),
        ("pyautogui.mouseDown(button='wheel')", "button must be one of"),
        ("pyautogui.dragTo(5)", "missing y"),
        ("pyautogui.dragTo(5, 6, mouseDownUp=1)", "mouseDownUp must be True or False"),
        ("pyautogui.keyDown('ctrl', 'a')", "too many arguments"),
        ("pyautogui.keyUp()", "missing key"),
        ("pyautogui.keyDown('hyper')", "unknown key"),
    ],
)
def test_malformed_code_is_refused_with_its_reason(code, reason):
    with pytest.raises(ActionParseError, match=reason):
        parse_actions(code)


@pytest.mark.parametrize(
    "code",
    [
        "__import__('os').system('touch /tmp/pwned')",
        "import os",
        "import pyautogui as os",
        "from os import system",
        "exec('print(1)')",
        "eval('1+1')",
        "pyautogui.click(__import__('os').getpid(), 1)",
        "pyautogui.write(open('/etc/passwd').read())",
        "pyautogui.click(*[1, 2])",
        "pyautogui.click(**{'x': 1, 'y': 2})",
        "pyautogui.click(1 + 1, 2)",
        "os.system('id')",
        "pyautogui.__class__.__init__.__globals__",
        "pyautogui.click.__call__(1, 2)",
        "getattr(pyautogui, 'click')(1, 2)",
        "x = pyautogui.click(1, 2)",
        "for _ in range(10**9): pyautogui.click(1, 2)",
        "lambda: pyautogui.click(1, 2)",
        "pyautogui.FAILSAFE = True",
        "pyautogui.write(f'{1}')",
        "\n".join(["pyautogui.click(1, 2)"] * 40),
    ],
)
def test_hostile_code_is_refused_and_never_run(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ActionParseError):
        parse_actions(code)
    assert list(tmp_path.iterdir()) == []


def test_the_code_of_a_response_is_its_last_fenced_block():
    response = (
        "I will click.\n```python\npyautogui.click(1, 1)\n```\nno, this:\n```python\n"
        "pyautogui.click(2, 2)\n```"
    )
    assert parse_actions(extract_code(response)) == [Click(2, 2)]
    assert extract_code("DONE") == "DONE"
