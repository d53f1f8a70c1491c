"""Tool-use demonstrations for the warm start: the episode a record shows, as tokens, with the
loss on what the model writes (calls, answer) and never on the observations."""

from __future__ import annotations

import json

import pytest

from dockyard.data.base import PromptRecord
from dockyard.data.demonstrations import (
    DemonstratedCall,
    DemonstrationError,
    ToolDemonstrations,
    demonstration_extra,
    render_call,
)
from dockyard.data.tool_turns import PlainObservations, ToolResult
from dockyard.environments.tools.calls import parse_tool_calls
from dockyard.models import load_tokenizer

CALL = DemonstratedCall("calculator", {"expression": "37*48"}, "1776")


def _record(extra: dict) -> PromptRecord:
    return PromptRecord(
        index=4, prompt="37*48=", ground_truth="1776", env="arithmetic", extra=extra
    )


@pytest.mark.parametrize("fmt", ["hermes", "openai"])
def test_a_rendered_call_parses_back_as_the_call(fmt: str) -> None:
    # What the warm start teaches must be what the episode loop reads as a call.
    parsed = parse_tool_calls(render_call(fmt, CALL, "call_0"), fmt)
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("calculator", {"expression": "37*48"})
    ]


def test_the_episode_is_call_eos_observation_answer_eos_with_the_observation_not_learnt() -> None:
    tok = load_tokenizer("tiny://qwen2-calculator")
    demonstrate = ToolDemonstrations(tok, "hermes")
    continuation = demonstrate(_record(demonstration_extra([CALL])))

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    eos = [tok.eos_token_id]
    call = ids(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'
    )
    observation = PlainObservations(tok, "hermes").token_ids(
        [ToolResult("call_0", "calculator", "1776")]
    )
    answer = ids("1776") + eos
    assert continuation.token_ids == call + eos + observation + answer
    assert continuation.loss_mask == [1] * (len(call) + 1) + [0] * len(observation) + [1] * len(
        answer
    )
    assert tok.decode(observation) == "<tool_response>\n1776\n</tool_response>\n"


def test_a_record_without_a_demonstration_is_its_answer() -> None:
    tok = load_tokenizer("tiny://qwen2-calculator")
    continuation = ToolDemonstrations(tok, "hermes")(_record({}))
    assert continuation.token_ids == tok("1776", add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id
    ]
    assert set(continuation.loss_mask) == {1}


@pytest.mark.parametrize(
    "demonstration",
    [
        {"tool_calls": []},
        {"tool_calls": [{"name": "calculator", "arguments": {}}]},
        {"tool_calls": [{"name": "", "arguments": {}, "result": "1"}]},
        {"tool_calls": [{"name": "c", "arguments": [], "result": "1"}]},
        {"tool_calls": [{"name": "c", "arguments": {}, "result": 1}]},
        {"calls": []},
        "calculator",
    ],
    ids=[
        "no-calls",
        "no-result",
        "empty-name",
        "list-arguments",
        "number-result",
        "other-key",
        "text",
    ],
)
def test_a_malformed_demonstration_is_refused_with_its_record(demonstration: object) -> None:
    tok = load_tokenizer("tiny://qwen2-calculator")
    with pytest.raises(DemonstrationError, match="record 4: demonstration"):
        ToolDemonstrations(tok, "hermes")(_record({"demonstration": demonstration}))


def test_the_demonstration_is_json_a_jsonl_record_can_carry() -> None:
    extra = demonstration_extra([CALL])
    assert json.loads(json.dumps(extra)) == extra
