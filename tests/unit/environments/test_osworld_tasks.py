"""OSWorld-shaped tasks are read strictly (a bad task is refused with the field that is wrong),
and the shipped records' prompts are what their tasks render."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dockyard.environments.osworld.prompts import screenshot_task_message, task_prompt
from dockyard.environments.osworld.tasks import TaskError, parse_task
from tests.sandbox_service import dockyard_command

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "osworld.jsonl"
RECORDS = [json.loads(line) for line in DATA.read_text().splitlines()]


def test_each_shipped_prompt_is_its_task_rendered():
    assert len(RECORDS) >= 5
    for record in RECORDS:
        task = parse_task(record["task"])
        assert task.id == record["id"] == record["answer"]
        assert record["prompt"] == task_prompt(task)


# OSWorld's computer_13 action types (desktop_env/actions.py), in its order.
OSWORLD_COMPUTER_13 = [
    "MOVE_TO",
    "CLICK",
    "MOUSE_DOWN",
    "MOUSE_UP",
    "RIGHT_CLICK",
    "DOUBLE_CLICK",
    "DRAG_TO",
    "SCROLL",
    "TYPING",
    "PRESS",
    "KEY_DOWN",
    "KEY_UP",
    "HOTKEY",
    "WAIT",
    "FAIL",
    "DONE",
]


def test_the_prompt_tells_the_agent_the_selected_action_space():
    task = parse_task(RECORDS[0]["task"])
    pyautogui = task_prompt(task, "pyautogui").splitlines()[1]
    computer_13 = task_prompt(task, "computer_13").splitlines()[1]
    assert pyautogui == 'Act: computer {"action": pyautogui code|DONE|FAIL}'
    assert computer_13 == (
        'Act: computer {"action_type": ' + "|".join(OSWORLD_COMPUTER_13) + ", params}"
    )
    # Only the action line differs: the task and the first screen are the same.
    assert task_prompt(task, "pyautogui").replace(pyautogui, computer_13) == task_prompt(
        task, "computer_13"
    )


def test_the_prompts_command_renders_a_dataset_for_an_action_space(tmp_path):
    out = tmp_path / "computer_13.jsonl"
    command = dockyard_command("osworld", "prompts", "--action-space", "computer_13")
    subprocess.run([*command, str(DATA), str(out)], check=True, timeout=120)
    rendered = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rendered] == [r["id"] for r in RECORDS]
    for record, original in zip(rendered, RECORDS, strict=True):
        assert record["prompt"] == task_prompt(parse_task(record["task"]), "computer_13")
        assert {k: v for k, v in record.items() if k != "prompt"} == {
            k: v for k, v in original.items() if k != "prompt"
        }
    # The default space renders the shipped file as it is.
    same = tmp_path / "pyautogui.jsonl"
    subprocess.run([*dockyard_command("osworld", "prompts"), str(DATA), str(same)], check=True)
    assert same.read_text() == DATA.read_text()


def test_the_prompts_command_refuses_a_record_without_a_readable_task(tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text(DATA.read_text().splitlines()[0] + '\n{"id": "x", "task": "{}"}\n')
    command = dockyard_command("osworld", "prompts", str(source), str(tmp_path / "out.jsonl"))
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert finished.returncode != 0
    assert f"{source}:2:" in finished.stderr
    assert not (tmp_path / "out.jsonl").exists()  # nothing half-written


def test_each_shipped_screenshot_record_is_its_tasks_image_part_then_text():
    # The screenshot preset's records: the same tasks, each a user message whose image part
    # the episode fills with the desktop's first screenshot (OSWorld's first observation).
    shots = [json.loads(line) for line in DATA.with_name("osworld_screenshot.jsonl").open()]
    assert [r["task"] for r in shots] == [r["task"] for r in RECORDS]
    for record in shots:
        task = parse_task(record["task"])
        [message] = record["messages"]
        assert message == screenshot_task_message(task)
        image, text = message["content"]
        assert image == {"type": "image"}
        instruction, action_space, *_tree = task_prompt(task).split("\n")
        assert text["text"] == f"{instruction}\n{action_space}\n"


def field(**widget: object) -> dict[str, object]:
    return {"type": "text_field", "name": "A", "x": 0, "y": 0, "width": 50, "height": 20, **widget}


def task(*widgets: dict[str, object], rules=({"name": "A", "text": "x"},), **top: object):
    return {
        "id": "t",
        "instruction": "do it",
        "config": [{"type": "desktop", "parameters": {"screen": [100, 100], "widgets": widgets}}],
        "evaluator": {"func": "check_accessibility_tree", "expected": {"rules": list(rules)}},
        **top,
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (task(field(x=90)), "off the 100x100 screen"),
        (task(field(), field()), "unique"),
        (task(field(), rules=[{"name": "B", "text": "x"}]), "names no widget"),
        (task(field(type="menu")), "a menu needs them"),
        (task(field(options=["a"])), "options are for menus"),
        (task(field(checked=True)), "checked is for checkboxes"),
        (task(field(on_press={"target": "A", "text": ""})), "on_press is for buttons"),
        (task(field(type="slider")), "type"),
        (task(field(x=-1)), "x"),
        (task(field(), rules=[]), "needs expected.rules"),
        (task(field(), extra_key=1), "extra_key"),
        (task(field(width="50")), "width"),
    ],
)
def test_a_bad_task_is_refused_with_the_field_that_is_wrong(raw, message):
    with pytest.raises(TaskError, match=message) as refused:
        parse_task(json.dumps(raw))
    assert refused.value.reason == "bad_task"


def test_screenshots_are_refused_at_launch_where_the_policy_would_never_see_them():
    # A screenshot is shown only in an episode, to a policy allowed images: a single-turn run
    # or a text-only policy would drop every one, so the config says so at launch instead.
    from dockyard.config.capabilities import not_implemented
    from dockyard.config.loader import load_config
    from dockyard.config.sections.env import OsworldEnvConfig
    from dockyard.environments.tools.desktop import DesktopToolbox

    preset = "configs/cpu/grpo_osworld.yaml"  # episodes, images not allowed
    assert not_implemented(load_config(preset, [])) == []
    screenshots = ["env.osworld.observation_type=screenshot"]
    text_only = load_config(preset, screenshots)
    assert [i.path for i in not_implemented(text_only)] == ["env.osworld.observation_type"]
    allowed = [*screenshots, "policy.generation.allow_multimodal_inputs=true"]
    assert not_implemented(load_config(preset, allowed)) == []
    single_turn = load_config(
        preset,
        [*allowed, "grpo.structured_tool_use.enabled=false", "grpo.max_rollout_turns=1"],
    )
    assert [i.path for i in not_implemented(single_turn)] == ["env.osworld.observation_type"]
    # Where episodes show screenshots, the toolbox opens on every observation type.
    for kind in ("a11y_tree", "screenshot", "screenshot_a11y_tree"):
        DesktopToolbox(OsworldEnvConfig(simulator_url="http://127.0.0.1:1", observation_type=kind))
    with pytest.raises(ValueError, match=r"env\.osworld\.simulator_url: not set"):
        DesktopToolbox(OsworldEnvConfig())


def test_a_task_nested_past_the_parsers_depth_is_refused_not_a_crash():
    with pytest.raises(TaskError, match=r"not JSON|nested too deeply") as refused:
        parse_task("[" * 100_000 + "]" * 100_000)
    assert refused.value.reason == "bad_task"
