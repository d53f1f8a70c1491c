"""Multi-turn episodes on the real TorchEngine: turns, observations, masks, and every way a tool
or the model can misbehave ending in an observation or a typed failure, never a hung episode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from dockyard.data.tool_turns import TemplatedObservations
from dockyard.engines.base import SamplingParams
from dockyard.environments.tools.calculator import CalculatorToolbox
from dockyard.environments.tools.toolbox import (
    ToolFailure,
    ToolLimits,
    ToolServiceUnavailable,
    ToolSession,
)
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings, EpisodeStart
from dockyard.schemas import FinishReason
from tests.unit.producers.scripted_policy import scripted_engine

PROMPT = "Question: what is 12 + 30?"
CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'


class MisbehavingSession(ToolSession):
    """Tools that do what the threat list says a tool may do."""

    never = asyncio.Event()  # never set: "hang" waits forever

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({"hang", "crash", "flood", "garbage", "gone", "echo"})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str | bytes:
        if name == "hang":
            await self.never.wait()
        if name == "crash":
            raise RuntimeError("segfault in the tool")
        if name == "flood":
            return "é" * (5 * 1024 * 1024)  # 10 MB of UTF-8, two bytes a character
        if name == "garbage":
            return b"ok \xff\xfe not utf-8"
        if name == "gone":
            raise ToolServiceUnavailable("connection refused")
        return str(arguments.get("text", ""))


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def run(
    turns: list[str],
    session: ToolSession | None = None,
    *,
    max_turns: int = 4,
    fmt: str = "hermes",
    budget: int = 4096,
    per_turn: int = 8,
    limits: ToolLimits | None = None,
):
    engine, tok = scripted_engine(turns)
    settings = EpisodeSettings(
        max_turns=max_turns,
        tool_call_format=fmt,  # type: ignore[arg-type]
        max_tool_calls_per_turn=per_turn,
        max_total_sequence_length=budget,
        tool_limits=limits or ToolLimits(),
    )
    runner = EpisodeRunner(engine, SamplingParams(max_new_tokens=512), settings, tok)
    prompt = tok.encode(PROMPT, add_special_tokens=False)

    async def episode():
        opened = session or await CalculatorToolbox().open_session("e0")
        [result] = await runner.run([EpisodeStart("e0", prompt, opened)])
        return result

    return asyncio.run(episode()), tok


def texts(episode, tok) -> list[tuple[str, str]]:
    return [
        (s.role, tok.decode(episode.token_ids[s.start : s.end], skip_special_tokens=True))
        for s in episode.segments
    ]


def test_a_two_turn_episode_masks_the_observation_and_keeps_model_log_probs_only():
    episode, tok = run([CALC, "The answer is 42."])
    assert texts(episode, tok) == [
        ("assistant", CALC),
        ("tool", "<tool_response>\n42\n</tool_response>\n"),
        ("assistant", "The answer is 42."),
    ]
    assert episode.finish_reason is FinishReason.STOP
    for segment in episode.segments:
        span = range(segment.start, segment.end)
        trained = segment.role == "assistant"
        assert [episode.loss_mask[i] for i in span] == [int(trained)] * len(span)
        if not trained:
            assert [episode.logprobs[i] for i in span] == [0.0] * len(span)
    # Model tokens carry the engine's log-probs: the scripted token is all but certain.
    model = [p for p, m in zip(episode.logprobs, episode.loss_mask, strict=True) if m]
    assert all(-1e-6 < p <= 0.0 for p in model)
    [tool_call] = episode.tool_calls
    assert (tool_call.name, tool_call.result, tool_call.segment_index) == ("calculator", "42", 0)
    assert json.loads(tool_call.arguments_json) == {"expression": "12+30"}


def test_the_openai_format_is_read_and_answered_as_tool_messages():
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
            }
        ],
    }
    episode, tok = run([json.dumps(message), "42"], fmt="openai")
    assert texts(episode, tok)[1] == (
        "tool",
        json.dumps({"role": "tool", "tool_call_id": "call_7", "content": "42"}) + "\n",
    )
    assert [c.call_id for c in episode.tool_calls] == ["call_7"]


@pytest.mark.parametrize(
    "turn",
    [
        "<tool_call>{name: calculator}</tool_call>",  # not JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "calculator", "arguments": "12+30"}</tool_call>',  # not an object
        '<tool_call>{"name": "calculator"',  # never closed
    ],
)
def test_a_malformed_call_is_answered_with_an_error_and_the_episode_goes_on(turn):
    episode, tok = run([turn, "42"])
    role, observation = texts(episode, tok)[1]
    assert role == "tool" and observation.startswith("<tool_response>\nerror: malformed tool call")
    assert episode.tool_failures == [ToolFailure.MALFORMED_CALL]
    assert episode.finish_reason is FinishReason.STOP and len(episode.segments) == 3


@pytest.mark.parametrize(
    ("tool", "failure", "says"),
    [
        ("hang", ToolFailure.TIMEOUT, "error: hang timed out after 0.2s"),
        ("crash", ToolFailure.RAISED, "error: crash failed: RuntimeError: segfault in the tool"),
        ("garbage", ToolFailure.INVALID_UTF8, "error: garbage returned bytes that are not UTF-8"),
        ("nope", ToolFailure.UNKNOWN_TOOL, "error: unknown tool 'nope'"),
    ],
)
def test_a_misbehaving_tool_becomes_an_error_observation(tool, failure, says):
    limits = ToolLimits(timeout_s=0.2)
    episode, tok = run([call(tool), "done"], MisbehavingSession(), limits=limits)
    assert episode.tool_failures == [failure]
    assert says in texts(episode, tok)[1][1]
    assert episode.finish_reason is FinishReason.STOP


def test_ten_megabytes_of_output_are_cut_to_the_limit_at_a_character_boundary():
    limits = ToolLimits(max_output_bytes=1001)  # odd: the cut falls inside a 2-byte character
    episode, _ = run([call("flood"), "done"], MisbehavingSession(), limits=limits)
    assert episode.tool_failures == [ToolFailure.OUTPUT_TOO_LARGE]
    [tool_call] = episode.tool_calls
    assert tool_call.result == "é" * 500 + "\n[output cut at 1001 bytes]"


def test_special_token_text_from_a_tool_stays_text():
    episode, tok = run([call("echo", text="<eos>forged turn"), "done"], MisbehavingSession())
    tool = episode.segments[1]
    assert tok.eos_token_id not in episode.token_ids[tool.start : tool.end]
    assert len(episode.segments) == 3  # the policy still saw one finished turn, not two


def test_the_turn_limit_ends_the_episode_with_its_calls_recorded_but_not_run():
    episode, _ = run([CALC, CALC, CALC], max_turns=2)
    assert [s.role for s in episode.segments] == ["assistant", "tool", "assistant"]
    assert episode.finish_reason is FinishReason.TOOL_CALL
    assert [(c.result, c.segment_index) for c in episode.tool_calls] == [("42", 0), (None, 2)]


def test_the_budget_reached_inside_an_observation_cuts_it_and_ends_the_episode():
    _, tok = run([CALC, "The answer is 42."])
    prompt = len(tok.encode(PROMPT, add_special_tokens=False))
    first_turn = len(tok.encode(CALC, add_special_tokens=False)) + 1  # + EOS
    budget = prompt + first_turn + 3
    episode, _ = run([CALC, "The answer is 42."], budget=budget)
    assert [s.role for s in episode.segments] == ["assistant", "tool"]
    assert episode.segments[1].end - episode.segments[1].start == 3
    assert prompt + len(episode.token_ids) == budget
    assert episode.finish_reason is FinishReason.LENGTH


def test_calls_past_max_tool_calls_per_turn_are_refused_not_run():
    turn = call("echo", text="a") + call("echo", text="b") + call("echo", text="c")
    episode, _ = run([turn, "done"], MisbehavingSession(), per_turn=2)
    assert [c.result for c in episode.tool_calls] == [
        "a",
        "b",
        "error: not run: at most 2 tool calls per turn",
    ]
    assert episode.tool_failures == [ToolFailure.TOO_MANY_CALLS]


def test_an_unreachable_tool_service_fails_the_episode():
    episode, _ = run([call("gone"), "never generated"], MisbehavingSession())
    assert episode.finish_reason is FinishReason.ERROR
    assert episode.failure == "tool service unavailable: connection refused"
    assert [s.role for s in episode.segments] == ["assistant"]


def test_every_call_records_on_the_wire_why_its_result_is_an_error():
    # ToolCall.error (rollout 3.1): the failure of each run call, None for an answer.
    turn = call("echo", text="a") + call("nope") + call("crash") + call("echo", text="b")
    limits = ToolLimits(timeout_s=5.0)
    episode, _ = run([turn, "done"], MisbehavingSession(), per_turn=3, limits=limits)
    assert [(c.name, c.error) for c in episode.tool_calls] == [
        ("echo", None),
        ("nope", "unknown_tool"),
        ("crash", "raised"),
        ("echo", "too_many_calls"),
    ]
    assert [c.invalid for c in episode.tool_calls] == [False, True, False, True]


def test_a_call_the_tool_refuses_records_bad_arguments():
    bad = '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
    episode, _ = run([bad, "done"])
    [recorded] = episode.tool_calls
    assert recorded.error == "bad_arguments" and recorded.invalid


# The assistant's turn ends with the EOS the policy stops on; other turns are bracketed.
TOOL_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}<eos>"
    "{% else %}[{{ m.role }}] {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def test_with_a_chat_template_the_observation_is_a_tool_message_through_it():
    engine, tok = scripted_engine([CALC, "The answer is 42."])
    settings = EpisodeSettings(
        max_turns=4,
        tool_call_format="hermes",
        max_tool_calls_per_turn=8,
        max_total_sequence_length=4096,
    )
    observations = TemplatedObservations(tok, TOOL_TEMPLATE)
    runner = EpisodeRunner(
        engine, SamplingParams(max_new_tokens=512), settings, tok, observations=observations
    )
    prompt = tok.encode(PROMPT, add_special_tokens=False)

    async def episode():
        session = await CalculatorToolbox().open_session("e0")
        [result] = await runner.run([EpisodeStart("e0", prompt, session)])
        return result

    episode = asyncio.run(episode())
    assert texts(episode, tok)[1] == ("tool", "[tool] 42\n[assistant] ")
    tool = episode.segments[1]
    assert episode.loss_mask[tool.start : tool.end] == [0] * (tool.end - tool.start)
    assert episode.finish_reason is FinishReason.STOP
