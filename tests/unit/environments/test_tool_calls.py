"""Reading tool calls and thinking blocks off a turn, and the scorer flags they raise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dockyard.consumers.score_conversion import OutputChecks, output_flags
from dockyard.environments.base import ScoreFlag
from dockyard.environments.tools.calls import (
    ThinkingProblem,
    parse_tool_calls,
    thinking_problem,
)
from dockyard.models.tokenizers import DEFAULT_CORPUS, train_bpe_tokenizer
from dockyard.schemas import (
    EngineInfo,
    RolloutSample,
    SampleTimings,
    SamplingParams,
    Segment,
    ToolCall,
)


def test_hermes_blocks_are_read_in_order_with_the_text_around_them_ignored():
    text = (
        'Let me compute. <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    )
    parsed = parse_tool_calls(text, "hermes")
    assert [(c.name, c.arguments) for c in parsed.calls] == [("a", {"x": 1}), ("b", {})]
    assert parsed.malformed == ()


def test_a_plain_answer_holds_no_call():
    for fmt in ("hermes", "openai"):
        assert not parse_tool_calls("The answer is 42.", fmt).wants_tools  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>{"name": "a", "arguments": {}, "x": 1}</tool_call>', "x: Extra inputs"),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', "name: String should have"),
        ('</tool_call>{"name": "a"}', "</tool_call> without <tool_call>"),
    ],
)
def test_hermes_calls_that_cannot_be_read_are_reported_with_why(text, reason):
    [malformed] = parse_tool_calls(text, "hermes").malformed
    assert malformed.reason.startswith(reason)


def test_openai_messages_need_json_object_arguments():
    def message(arguments: str) -> str:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        return json.dumps({"role": "assistant", "tool_calls": [call]})

    assert parse_tool_calls(message('{"q": 1}'), "openai").calls[0].call_id == "c1"
    assert parse_tool_calls(message("[1]"), "openai").malformed
    assert parse_tool_calls(message("{oops"), "openai").malformed
    assert parse_tool_calls('{"tool_calls": [', "openai").malformed  # cut short
    assert not parse_tool_calls('{"answer": 42}', "openai").wants_tools  # JSON, but no call


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("<think>a</think> 42", None),
        ("  <think>a</think>", None),
        ("42", None),
        ("<think>a", ThinkingProblem.UNCLOSED),
        ("a</think> 42", ThinkingProblem.UNOPENED),
        ("</think><think>", ThinkingProblem.UNOPENED),
        ("<think>a</think><think>b</think>", ThinkingProblem.REPEATED),
        ("42 <think>a</think>", ThinkingProblem.NOT_FIRST),
    ],
)
def test_thinking_blocks(text, problem):
    assert thinking_problem(text) is problem


def sample(tok, turns: list[tuple[str, str]], calls: list[ToolCall] | None = None) -> RolloutSample:
    ids: list[int] = []
    segments = []
    for role, text in turns:
        start = len(ids)
        ids += tok.encode(text, add_special_tokens=False)
        segments.append(Segment(role=role, start=start, end=len(ids)))
    n = len(ids)
    return RolloutSample(
        sample_index=0,
        prompt_token_ids=np.asarray([1], dtype=np.int32),
        response_token_ids=np.asarray(ids, dtype=np.int32),
        behaviour_logprobs=np.zeros(n, dtype=np.float32),
        token_weight_versions=np.zeros(n, dtype=np.int64),
        loss_mask=np.ones(n, dtype=np.uint8),
        finish_reason="stop",
        sampling=SamplingParams(temperature=1.0, max_new_tokens=8),
        engine=EngineInfo(name="torch", version="t"),
        worker_id="w",
        timings=SampleTimings(started_at_unix_s=0.0, finished_at_unix_s=0.0),
        segments=segments,
        tool_calls=calls or [],
    )


def test_the_scorer_flags_the_turns_of_the_model_only():
    tok = train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="qwen2")
    checks = OutputChecks(tool_call_format="hermes", thinking=True)
    broken = sample(tok, [("assistant", "<tool_call>{nope</tool_call>"), ("tool", "x")])
    assert output_flags(broken, tok, checks) == {ScoreFlag.INVALID_TOOL_CALL}
    # An observation that quotes a broken call or an open <think> is not the model's doing.
    quoted = sample(tok, [("assistant", "<think>ok</think> done"), ("tool", "<tool_call>{<think>")])
    assert output_flags(quoted, tok, checks) == frozenset()
    thinking = sample(tok, [("assistant", "<think>never closed")])
    assert output_flags(thinking, tok, checks) == {ScoreFlag.MALFORMED_THINKING}
    assert output_flags(thinking, tok, OutputChecks()) == frozenset()


@pytest.mark.parametrize(
    ("error", "flagged"),
    [
        ("unknown_tool", True),
        ("bad_arguments", True),
        ("too_many_calls", True),
        ("timeout", False),
        ("raised", False),
        (None, False),
    ],
)
def test_the_scorer_flags_calls_the_episode_recorded_as_invalid(error, flagged):
    # A well-formed call of a tool that does not exist, or with arguments the tool refused,
    # reads fine in the turn's text: only the recorded ToolCall.error says it was invalid.
    tok = train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="qwen2")
    text = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    recorded = ToolCall(call_id="c", name="nope", arguments_json="{}", result="e", error=error)
    turns = sample(tok, [("assistant", text), ("tool", "e")], [recorded])
    expected = {ScoreFlag.INVALID_TOOL_CALL} if flagged else set()
    assert output_flags(turns, tok, OutputChecks(tool_call_format="hermes")) == expected
    assert output_flags(turns, tok, OutputChecks()) == frozenset()  # tools off: no check
