"""The ``osworld`` environment and its episode toolbox against a real simulator process: the
reward is the task's evaluator on the final state of a fresh desktop replaying the sample's
actions, malformed or hostile output scores 0 with its reason, and a bad task is refused."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from dockyard.config.sections.env import EnvConfig, OsworldEnvConfig
from dockyard.engines.base import SamplingParams
from dockyard.environments.base import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    ToolCallRecord,
)
from dockyard.environments.osworld.actions import parse_actions
from dockyard.environments.osworld.desktop import Desktop
from dockyard.environments.osworld.environment import OsworldEnvironment
from dockyard.environments.osworld.tasks import parse_task
from dockyard.environments.registry import build_environment
from dockyard.environments.tools.calls import ParsedCall
from dockyard.environments.tools.toolbox import (
    NOT_RUN_PREFIX,
    TaskRefused,
    ToolLimits,
    run_tool_call,
    toolbox_class,
)
from dockyard.producers.episodes import Episode, EpisodeRunner, EpisodeSettings
from dockyard.schemas import FinishReason
from tests.osworld_simulator import simulator_command
from tests.sandbox_service import sandbox_service
from tests.unit.producers.scripted_policy import scripted_engine

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "osworld.jsonl"
RECORDS = {record["id"]: record for record in map(json.loads, DATA.read_text().splitlines())}


@pytest.fixture(scope="module")
def simulator_url() -> Iterator[str]:
    with sandbox_service(simulator_command()) as url:
        yield url


@pytest.fixture
async def env(simulator_url):
    settings = OsworldEnvConfig(simulator_url=simulator_url, max_actions=5)
    environment = build_environment("osworld", EnvironmentContext(EnvConfig(osworld=settings)))
    assert isinstance(environment, OsworldEnvironment)  # from the registry, by name
    yield environment
    await environment.aclose()


def calls(*actions: str, result: str | None = "observed") -> list[ToolCallRecord]:
    return [ToolCallRecord("computer", json.dumps({"action": a}), result) for a in actions]


def group(task_id: str, *samples: SampleInput, task: object = None) -> ScoringGroup:
    extra = {"task": RECORDS[task_id]["task"] if task is None else task}
    return ScoringGroup(f"g-{task_id}", "osworld", RECORDS[task_id]["prompt"], samples, extra=extra)


@pytest.mark.parametrize("task_id", sorted(RECORDS))
async def test_each_shipped_task_is_solved_by_its_solution_and_not_by_doing_nothing(env, task_id):
    solution = json.loads(RECORDS[task_id]["solution"])  # a JSON list, as metadata carries it
    scores = await env.score(
        group(
            task_id,
            SampleInput("", tool_calls=calls(*solution)),
            SampleInput("", tool_calls=[]),
        )
    )
    solved, idle = scores.samples
    assert (solved.reward, solved.components["solved"]) == (1.0, 1.0), solved.detail
    assert idle.reward == 0.0
    assert idle.detail


async def test_the_rules_name_what_the_final_state_gets_wrong(env):
    wrong = calls("pyautogui.click(20, 20)", "pyautogui.write('Bob')")
    [score] = (await env.score(group("osw-fill-name", SampleInput("", tool_calls=wrong)))).samples
    assert score.reward == 0.0
    assert "'Name' reads 'Bob', expected 'Ada'" in score.detail
    assert "'Status' reads '', expected 'Submitted'" in score.detail
    assert score.components["actions"] == 2.0


async def test_a_single_turn_response_is_its_action_code(env):
    samples = [
        SampleInput("I tick it.\n```python\npyautogui.click(15, 15)\n```<|im_end|>junk"),
        SampleInput("I think the box should be ticked"),
        SampleInput("```python\n__import__('os').system('touch /tmp/osworld-pwned')\n```"),
        SampleInput("FAIL"),
        SampleInput(""),
    ]
    scores = (await env.score(group("osw-agree", *samples))).samples
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 0.0, 0.0]
    for malformed in (scores[1], scores[2], scores[4]):
        assert malformed.flags == {ScoreFlag.INVALID_ACTION}
        assert malformed.detail.startswith("no valid action: ")
    assert "not Python" in scores[1].detail
    assert not Path("/tmp/osworld-pwned").exists()
    assert scores[3].detail == "the agent answered FAIL to a feasible task"


async def test_an_infeasible_task_is_solved_only_by_fail(env):
    scores = await env.score(
        group(
            "osw-print",
            SampleInput("", tool_calls=calls("FAIL")),
            SampleInput("", tool_calls=calls("DONE")),
            SampleInput("", tool_calls=calls("pyautogui.click(15, 15)")),
        )
    )
    assert scores.rewards == [1.0, 0.0, 0.0]


async def test_the_replay_refuses_what_the_tool_refused(env):
    tool_calls = [
        # Not run by the episode (past the calls of a turn, or the turn limit): left out.
        ToolCallRecord("computer", json.dumps({"action": "pyautogui.click(15, 15)"}), None),
        ToolCallRecord(
            "computer",
            json.dumps({"action": "pyautogui.click(15, 15)"}),
            f"{NOT_RUN_PREFIX}at most 1 tool calls per turn",
        ),
        # Arguments the tool refuses, another tool's call: left out.
        ToolCallRecord("computer", json.dumps({"code": "pyautogui.click(15, 15)"}), "error"),
        ToolCallRecord("bash", json.dumps({"action": "pyautogui.click(15, 15)"}), "error"),
        ToolCallRecord("computer", "{not json", "error"),
        *calls("pyautogui.click(15, 15)", "DONE", "pyautogui.click(15, 15)"),
    ]
    [score] = (await env.score(group("osw-agree", SampleInput("", tool_calls=tool_calls)))).samples
    # One click ticked the box; the click after DONE was refused (the task was over).
    assert score.reward == 1.0, score.detail
    assert score.components["actions"] == 1.0


async def test_actions_past_max_actions_are_refused(env):
    # env.osworld.max_actions is 5 here: the sixth click (the one ticking the box) is refused.
    clicks = ["pyautogui.click(300, 190)"] * 5 + ["pyautogui.click(15, 15)"]
    [score] = (
        await env.score(group("osw-agree", SampleInput("", tool_calls=calls(*clicks))))
    ).samples
    assert score.reward == 0.0
    assert score.components["actions"] == 5.0


@pytest.mark.parametrize(
    ("task", "reason"),
    [("", "bad_task"), ("{", "bad_task"), (42, "missing_task"), ('{"id": "x"}', "bad_task")],
)
async def test_a_task_that_cannot_be_read_is_refused_not_scored(env, task, reason):
    with pytest.raises(InvalidScoringInput) as refused:
        await env.score(group("osw-agree", SampleInput("DONE"), task=task))
    assert refused.value.reason_code == reason


async def run_episode(turns: list[str], settings: OsworldEnvConfig) -> Episode:
    """One episode of osw-fill-name, the model's turns scripted, through the osworld toolbox."""
    engine, tok = scripted_engine(turns)
    episode_settings = EpisodeSettings(
        max_turns=8,
        tool_call_format="hermes",
        max_tool_calls_per_turn=1,
        max_total_sequence_length=8192,
    )
    runner = EpisodeRunner(
        engine,
        SamplingParams(max_new_tokens=256),
        episode_settings,
        tok,
        EnvConfig(osworld=settings),
    )
    record = RECORDS["osw-fill-name"]
    prompt = tok.encode(record["prompt"], add_special_tokens=False)
    [episode] = await runner.run_prompts("osworld", [("ep-0", prompt, {"task": record["task"]})])
    await runner.aclose()
    return episode


def computer(action: str) -> str:
    call = {"name": "computer", "arguments": {"action": action}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


async def test_an_episode_drives_its_own_desktop_and_the_replay_scores_it(simulator_url):
    turns = [
        computer("pyautogui.click(20, 20)"),
        computer("import os"),  # refused: the model reads why, the desktop is unchanged
        computer("pyautogui.write('Ada')"),
        computer("pyautogui.click(200, 20)"),
        computer("DONE"),
        "The form is submitted.",
    ]
    episode = await run_episode(turns, OsworldEnvConfig(simulator_url=simulator_url))
    assert episode.finish_reason is FinishReason.STOP
    results = [call.result or "" for call in episode.tool_calls]
    assert len(results) == 5
    assert "only 'import pyautogui' and 'import time' are allowed" in results[1]
    assert "entry\tName\tAda\t" in results[2]  # the observation shows the typed text
    assert "label\tStatus\tSubmitted\t" in results[3]
    assert results[4].startswith("DONE recorded")
    environment = OsworldEnvironment(OsworldEnvConfig(simulator_url=simulator_url))
    records = [
        ToolCallRecord(call.name, call.arguments_json, call.result) for call in episode.tool_calls
    ]
    scores = await environment.score(group("osw-fill-name", SampleInput("", tool_calls=records)))
    await environment.aclose()
    assert scores.rewards == [1.0]


async def test_the_toolbox_refuses_a_task_it_cannot_set_up(simulator_url):
    toolbox = toolbox_class("osworld").from_env_config(
        EnvConfig(osworld=OsworldEnvConfig(simulator_url=simulator_url))
    )
    with pytest.raises(TaskRefused) as refused:
        await toolbox.open_session("e0", {"task": '{"id": "t"}'})
    assert refused.value.reason == "bad_task"
    await toolbox.aclose()


# ---- computer_13: OSWorld's JSON action space (env.osworld.action_space) --------------------


@pytest.fixture
async def env13(simulator_url):
    settings = OsworldEnvConfig(simulator_url=simulator_url, action_space="computer_13")
    environment = OsworldEnvironment(settings)
    yield environment
    await environment.aclose()


def calls13(*actions: object) -> list[ToolCallRecord]:
    return [ToolCallRecord("computer", json.dumps(a), "observed") for a in actions]


SOLUTIONS_13 = {
    "osw-fill-name": [
        {"action_type": "CLICK", "x": 20, "y": 20},
        {"action_type": "TYPING", "text": "Ada"},
        {"action_type": "CLICK", "parameters": {"x": 200.4, "y": 20}},
        {"action_type": "DONE"},
    ],
    "osw-agree": [{"action_type": "MOVE_TO", "x": 15, "y": 15}, {"action_type": "CLICK"}],
    "osw-colour": [
        {"action_type": "CLICK", "x": 20, "y": 20},
        {"action_type": "PRESS", "key": "down"},
        {"action_type": "PRESS", "key": "down"},
        {"action_type": "PRESS", "key": "enter"},
    ],
    "osw-clear": [
        {"action_type": "DOUBLE_CLICK", "x": 20, "y": 20},
        {"action_type": "PRESS", "key": "backspace"},
        {"action_type": "DONE"},
    ],
    "osw-print": [{"action_type": "FAIL"}],
}


@pytest.mark.parametrize("task_id", sorted(SOLUTIONS_13))
async def test_each_task_is_solved_by_computer_13_actions(env13, task_id):
    [score] = (
        await env13.score(
            group(task_id, SampleInput("", tool_calls=calls13(*SOLUTIONS_13[task_id])))
        )
    ).samples
    assert score.reward == 1.0, score.detail


async def test_a_computer_13_replay_leaves_out_what_the_tool_refused(env13):
    tool_calls = calls13(
        {"action": "pyautogui.click(15, 15)"},  # the pyautogui space's call: not an action here
        {"action_type": "CLICK", "x": 15},  # refused: x without y
        {"action_type": "CLICK", "x": 15, "y": 15, "clicks": 2},  # refused: not a parameter
        {"action_type": "DONE"},
        {"action_type": "CLICK", "x": 15, "y": 15},  # refused: after DONE
    )
    [score] = (
        await env13.score(group("osw-agree", SampleInput("", tool_calls=tool_calls)))
    ).samples
    assert score.reward == 0.0
    assert score.components["actions"] == 0.0
    assert score.detail == "'I agree' is not checked"


async def test_a_single_turn_computer_13_response_is_scored_and_malformed_ones_score_0(env13):
    samples = [
        SampleInput('I tick it.\n```json\n{"action_type": "CLICK", "x": 15, "y": 15}\n```'),
        SampleInput('[{"action_type": "CLICK", "x": 15, "y": 15}, {"action_type": "DONE"}]'),
        SampleInput("```python\npyautogui.click(15, 15)\n```"),
        SampleInput('{"action_type": "CLICK", "x": 15, "y": 15, "num_clicks": 7}'),
        SampleInput('{"action_type": "TELEPORT"}'),
        SampleInput('{"action_type": "PRESS", "key": "hyper"}'),
        SampleInput('[{"action_type": "DONE"}, {"action_type": "CLICK", "x": 15, "y": 15}]'),
        SampleInput("FAIL"),
    ]
    scores = (await env13.score(group("osw-agree", *samples))).samples
    assert [s.reward for s in scores] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    reasons = {
        2: "not JSON",
        3: "num_clicks must be the integer 1, 2 or 3",
        4: "unknown action_type 'TELEPORT'",
        5: "unknown key 'hyper'",
        6: "the task is over: the agent answered DONE",
    }
    for index, reason in reasons.items():
        assert scores[index].flags == {ScoreFlag.INVALID_ACTION}
        assert scores[index].detail.startswith("no valid action: ")
        assert reason in scores[index].detail
    assert scores[7].detail == "the agent answered FAIL to a feasible task"


def computer13(action: object) -> str:
    return f"<tool_call>{json.dumps({'name': 'computer', 'arguments': action})}</tool_call>"


async def test_a_computer_13_episode_solves_its_task_and_malformed_calls_are_tool_errors(
    simulator_url,
):
    turns = [
        computer13({"action_type": "CLICK", "x": 20, "y": 20}),
        computer13({"action_type": "CLICK", "x": 20}),  # refused: the model reads why
        computer13({"action": "pyautogui.write('Ada')"}),  # the other space's call: refused
        computer13({"action_type": "TYPING", "text": "Ada"}),
        computer13({"action_type": "CLICK", "x": 200, "y": 20}),
        computer13({"action_type": "DONE"}),
        "The form is submitted.",
    ]
    settings13 = OsworldEnvConfig(simulator_url=simulator_url, action_space="computer_13")
    episode = await run_episode(turns, settings13)
    assert episode.finish_reason is FinishReason.STOP
    results = [call.result or "" for call in episode.tool_calls]
    errors = [call.error for call in episode.tool_calls]
    assert errors == [None, "bad_arguments", "bad_arguments", None, None, None]
    assert "CLICK: give both x and y, or neither" in results[1]
    assert "unknown action_type None" in results[2]
    assert "entry\tName\tAda\t" in results[3]
    assert "label\tStatus\tSubmitted\t" in results[4]
    assert results[5].startswith("DONE recorded")
    environment = OsworldEnvironment(settings13)
    records = [
        ToolCallRecord(call.name, call.arguments_json, call.result) for call in episode.tool_calls
    ]
    scores = await environment.score(group("osw-fill-name", SampleInput("", tool_calls=records)))
    await environment.aclose()
    assert scores.rewards == [1.0]
    assert scores.samples[0].components["actions"] == 3.0


def rendered(task_id: str, *codes: str) -> bytes:
    """The screen of the task's desktop after ``codes``, rendered here (not by the service)."""
    desktop = Desktop.from_spec(parse_task(RECORDS[task_id]["task"]).desktop)
    for code in codes:
        for action in parse_actions(code):
            desktop.apply(action)
    return desktop.screenshot()


def act(code: str) -> ParsedCall:
    arguments = {"action": code}
    return ParsedCall("computer", json.dumps(arguments), arguments)


def pixels(png: bytes) -> bytes:
    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB").tobytes()


@pytest.mark.parametrize(
    ("kind", "shows_tree"), [("screenshot", False), ("screenshot_a11y_tree", True)]
)
async def test_a_screenshot_observation_is_the_desktops_screen_after_the_action(
    simulator_url, kind, shows_tree
):
    # OSWorld's observation types: the screen after each action (and the tree too with
    # screenshot_a11y_tree), and the first screen after the task's setup with the prompt.
    settings = OsworldEnvConfig(simulator_url=simulator_url, observation_type=kind)
    toolbox = toolbox_class("osworld").from_env_config(EnvConfig(osworld=settings))
    session = await toolbox.open_session("e0", {"task": RECORDS["osw-fill-name"]["task"]})
    try:
        [first] = await session.initial_images()
        click = act("pyautogui.click(20, 20)")
        clicked = await run_tool_call(session, click, ToolLimits())
        write = act("pyautogui.write('Ada')")
        written = await run_tool_call(session, write, ToolLimits())
        done = await run_tool_call(session, act("DONE"), ToolLimits())
    finally:
        await session.aclose()
        await toolbox.aclose()
    assert pixels(first) == pixels(rendered("osw-fill-name"))
    assert pixels(clicked.images[0]) == pixels(rendered("osw-fill-name", "pyautogui.click(20, 20)"))
    typed = rendered("osw-fill-name", "pyautogui.click(20, 20)", "pyautogui.write('Ada')")
    assert [pixels(png) for png in written.images] == [pixels(typed)]
    assert pixels(typed) != pixels(first)  # the screen shows the action
    assert ("entry\tName\tAda\t" in written.text) is shows_tree
    assert (written.failure, done.images) == (None, ())  # DONE ends the task: nothing to see
