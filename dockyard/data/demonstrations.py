"""Tool-use demonstrations for the supervised warm start.

A record whose ``extra["demonstration"]`` lists tool calls and what each returns is imitated as
the episode it shows: one turn per call (the call written in
``grpo.structured_tool_use.tool_call_format``, then EOS), the observation the episode loop would
append after it, and finally the answer. The loss covers what the model writes — the calls and
the answer — never the observations (in a rollout the episode loop writes those).

    {"demonstration": {"tool_calls": [
        {"name": "calculator", "arguments": {"expression": "37*48"}, "result": "1776"}]}}

Without a demonstration a record is imitated as its answer alone, as without tool use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dockyard.data.base import JsonValue, PromptRecord
from dockyard.data.tool_turns import Observations, PlainObservations, ToolResult

DEMONSTRATION_KEY = "demonstration"


class DemonstrationError(ValueError):
    """A record's demonstration is not what the module docstring shows."""


@dataclass(frozen=True)
class DemonstratedCall:
    name: str
    arguments: Mapping[str, JsonValue]
    result: str

    def as_json(self) -> dict[str, JsonValue]:
        return {"name": self.name, "arguments": dict(self.arguments), "result": self.result}


def demonstration_extra(calls: Sequence[DemonstratedCall]) -> dict[str, JsonValue]:
    """What a dataset puts in a record's ``extra`` to demonstrate ``calls``."""
    return {DEMONSTRATION_KEY: {"tool_calls": [call.as_json() for call in calls]}}


def demonstrated_calls(record: PromptRecord) -> tuple[DemonstratedCall, ...]:
    """The calls ``record`` demonstrates (none without a demonstration)."""
    value = record.extra.get(DEMONSTRATION_KEY)
    if value is None:
        return ()
    where = f"record {record.index}: {DEMONSTRATION_KEY}"
    if not isinstance(value, dict) or set(value) != {"tool_calls"}:
        raise DemonstrationError(f"{where} must be an object with only 'tool_calls'")
    calls = value["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise DemonstrationError(f"{where}.tool_calls must be a non-empty list")
    parsed = []
    for index, call in enumerate(calls):
        if not (
            isinstance(call, dict)
            and set(call) == {"name", "arguments", "result"}
            and isinstance(call["name"], str)
            and call["name"]
            and isinstance(call["arguments"], dict)
            and isinstance(call["result"], str)
        ):
            raise DemonstrationError(
                f"{where}.tool_calls[{index}] must be {{name: text, arguments: object, "
                "result: text}"
            )
        parsed.append(DemonstratedCall(call["name"], call["arguments"], call["result"]))
    return tuple(parsed)


def render_call(fmt: str, call: DemonstratedCall, call_id: str) -> str:
    """``call`` as the model writes it in ``fmt`` (what ``environments.tools.calls`` parses)."""
    if fmt == "hermes":
        body = json.dumps({"name": call.name, "arguments": dict(call.arguments)})
        return f"<tool_call>{body}</tool_call>"
    function = {"name": call.name, "arguments": json.dumps(dict(call.arguments))}
    return json.dumps({"tool_calls": [{"id": call_id, "type": "function", "function": function}]})


class _Tokenizer(Protocol):
    eos_token_id: int

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Continuation:
    """What the warm start imitates after a prompt, and which of its tokens it learns."""

    token_ids: list[int]
    loss_mask: list[int]


@dataclass(frozen=True)
class ToolDemonstrations:
    """A record's continuation: its demonstrated episode, or its answer."""

    tokenizer: _Tokenizer
    tool_call_format: str
    #: How the episode loop renders observations (its chat template's, or the plain form).
    observations: Observations | None = None

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def __call__(self, record: PromptRecord) -> Continuation:
        eos = [self.tokenizer.eos_token_id]
        observations = self.observations or PlainObservations(
            self.tokenizer,  # type: ignore[arg-type]  # a transformers tokenizer encodes
            self.tool_call_format,
        )
        tokens: list[int] = []
        mask: list[int] = []
        for index, call in enumerate(demonstrated_calls(record)):
            call_id = f"call_{index}"
            turn = self._ids(render_call(self.tool_call_format, call, call_id)) + eos
            seen = observations.token_ids([ToolResult(call_id, call.name, call.result)])
            tokens += turn + seen
            mask += [1] * len(turn) + [0] * len(seen)
        answer = self._ids(record.ground_truth) + eos
        return Continuation(tokens + answer, mask + [1] * len(answer))
