"""OSWorld-shaped tasks are read strictly (a bad task is refused with the field that is wrong),
and the shipped records' prompts are what their tasks render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dockyard.environments.osworld.prompts import task_prompt
from dockyard.environments.osworld.tasks import TaskError, parse_task

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "osworld.jsonl"
RECORDS = [json.loads(line) for line in DATA.read_text().splitlines()]


def test_each_shipped_prompt_is_its_task_rendered():
    assert len(RECORDS) >= 5
    for record in RECORDS:
        task = parse_task(record["task"])
        assert task.id == record["id"] == record["answer"]
        assert record["prompt"] == task_prompt(task)


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


def test_an_observation_other_than_the_tree_is_refused_at_launch():
    # Tool observations travel as text: a screenshot after each action would have to be
    # dropped, so the config says so at launch instead (and the toolbox will not start).
    from dockyard.config.capabilities import not_implemented
    from dockyard.config.loader import load_config
    from dockyard.config.sections.env import OsworldEnvConfig
    from dockyard.environments.tools.desktop import DesktopToolbox

    preset = "configs/cpu/grpo_osworld.yaml"
    assert not_implemented(load_config(preset, [])) == []
    screenshots = load_config(preset, ["env.osworld.observation_type=screenshot"])
    assert [i.path for i in not_implemented(screenshots)] == ["env.osworld.observation_type"]
    with pytest.raises(ValueError, match="only a11y_tree runs"):
        DesktopToolbox(
            OsworldEnvConfig(simulator_url="http://127.0.0.1:1", observation_type="screenshot")
        )
    with pytest.raises(ValueError, match=r"env\.osworld\.simulator_url: not set"):
        DesktopToolbox(OsworldEnvConfig())


def test_a_task_nested_past_the_parsers_depth_is_refused_not_a_crash():
    with pytest.raises(TaskError, match=r"not JSON|nested too deeply") as refused:
        parse_task("[" * 100_000 + "]" * 100_000)
    assert refused.value.reason == "bad_task"
