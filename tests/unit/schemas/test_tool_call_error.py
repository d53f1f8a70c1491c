"""``ToolCall.error`` (``rollout`` / ``scored_rollout`` 3.1, docs/wire-format.md): why a recorded
call's result is an error. A minor bump: 3.0 messages (no such key) still decode, with None; a
code is a snake_case identifier (refused ``invalid_field`` otherwise), and a well-formed code this
build does not know is read, as a tool failure, not as an invalid call."""

from __future__ import annotations

from typing import Any

import pytest
from schema_factories import craft, make_prompt_group, make_sample, unpack_payload

from dockyard.schemas import (
    CodecError,
    ReasonCode,
    Rollout,
    ScoredRollout,
    ToolCall,
    ToolCallError,
    decode,
    encode,
)
from dockyard.schemas.scored import SampleScore


def rollout_with(*errors: str | None) -> Rollout:
    calls = [
        ToolCall(call_id=f"c{i}", name="bash", arguments_json="{}", result="x", error=error)
        for i, error in enumerate(errors)
    ]
    samples = [make_sample(0, tool_calls=calls), make_sample(1)]
    return Rollout(group=make_prompt_group(), samples=samples, created_at_unix_s=1.7e9)


def envelope_of(message: Rollout) -> dict[str, Any]:
    envelope = unpack_payload(encode(message).payload)
    assert envelope["schema_version"] == "3.2"
    return envelope


def test_the_error_round_trips_in_a_rollout_and_a_scored_rollout():
    message = rollout_with("unknown_tool", None, "timeout")
    decoded = decode(None, encode(message).payload, expected=Rollout)
    assert [call.error for call in decoded.samples[0].tool_calls] == [
        "unknown_tool",
        None,
        "timeout",
    ]
    scores = [SampleScore(sample_index=i, reward=0.0) for i in range(2)]
    scored = ScoredRollout(rollout=message, scores=scores, scorer_id="s")
    assert decode(None, encode(scored).payload, expected=ScoredRollout) == scored


def test_a_3_0_message_without_the_key_decodes_with_no_error():
    envelope = envelope_of(rollout_with("bad_arguments"))
    for call in envelope["meta"]["samples"]["tool_calls"][0]:
        del call["error"]
    payload = craft(envelope["meta"], schema="rollout", version="3.0", data=envelope["data"])
    [call] = decode(None, payload, expected=Rollout).samples[0].tool_calls
    assert call.error is None and not call.invalid


@pytest.mark.parametrize("bad", ["Unknown_Tool", "", "unknown tool", "x" * 65, "1st"])
def test_a_code_that_is_not_a_snake_case_identifier_is_refused(bad: str):
    envelope = envelope_of(rollout_with("timeout"))
    envelope["meta"]["samples"]["tool_calls"][0][0]["error"] = bad
    payload = craft(envelope["meta"], schema="rollout", version="3.1", data=envelope["data"])
    with pytest.raises(CodecError) as caught:
        decode(None, payload)
    assert caught.value.reason is ReasonCode.INVALID_FIELD
    assert "tool_calls" in caught.value.detail


def test_a_code_of_the_wrong_type_is_refused():
    envelope = envelope_of(rollout_with("timeout"))
    envelope["meta"]["samples"]["tool_calls"][0][0]["error"] = 3
    payload = craft(envelope["meta"], schema="rollout", version="3.1", data=envelope["data"])
    with pytest.raises(CodecError) as caught:
        decode(None, payload)
    assert caught.value.reason is ReasonCode.WRONG_TYPE


def test_the_models_mistakes_are_invalid_calls_the_tools_failures_are_not():
    # The spec's invalid_tool_call_advantage is for the model's calls no tool could run.
    invalid = {"unknown_tool", "bad_arguments", "too_many_calls"}
    for code in ToolCallError:
        call = ToolCall(call_id="c", name="n", arguments_json="{}", error=code.value)
        assert call.invalid == (code.value in invalid), code
    later = ToolCall(call_id="c", name="n", arguments_json="{}", error="added_in_3_9")
    assert not later.invalid
    assert decode(None, encode(rollout_with("added_in_3_9")).payload) == rollout_with(
        "added_in_3_9"
    )
