"""Tool calls in a model's turn, as ``grpo.structured_tool_use.tool_call_format`` writes them.

``hermes`` (Qwen, Hermes, many open models): any number of
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks inside the turn's text.

``openai``: the turn is the assistant message of the OpenAI chat format as JSON,
``{"content": ..., "tool_calls": [{"id": ..., "type": "function", "function": {"name": ...,
"arguments": "<JSON text>"}}]}``; a turn that is not such an object is a plain answer.

A call that cannot be read is *malformed*: it is reported with its reason (it becomes an error
observation and earns ``grpo.invalid_tool_call_advantage``), never repaired or dropped.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ToolCallFormat = Literal["hermes", "openai"]
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = ("hermes", "openai")

_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
_HERMES_BLOCK = re.compile(re.escape(_HERMES_OPEN) + r"(.*?)" + re.escape(_HERMES_CLOSE), re.S)
#: How much of a malformed call is kept in its reason (the observation the model reads).
_SHOWN_CHARS = 80


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _HermesCall(_Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class _OpenAIFunction(_Strict):
    name: str = Field(min_length=1)
    #: JSON text, as the OpenAI format carries it.
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _an_object(cls, text: str) -> str:
        if not isinstance(json.loads(text), dict):  # a JSONDecodeError is a ValueError too
            raise ValueError("arguments must be a JSON object")
        return text


class _OpenAICall(_Strict):
    id: str = Field(min_length=1)
    type: Literal["function"]
    function: _OpenAIFunction


class _OpenAIMessage(BaseModel):
    # Other keys of an assistant message (role, content, refusal) are allowed and not read.
    tool_calls: list[_OpenAICall]


@dataclass(frozen=True)
class ParsedCall:
    name: str
    #: The arguments as JSON text (what travels in ``ToolCall.arguments_json``).
    arguments_json: str
    arguments: dict[str, Any]
    #: The model's own id (``openai``); hermes calls get one from the episode.
    call_id: str | None = None


@dataclass(frozen=True)
class MalformedCall:
    text: str
    reason: str


@dataclass(frozen=True)
class ParsedTurn:
    calls: tuple[ParsedCall, ...] = ()
    malformed: tuple[MalformedCall, ...] = ()

    @property
    def wants_tools(self) -> bool:
        """The model asked for tools (also with a malformed call: it gets told what was wrong)."""
        return bool(self.calls or self.malformed)


def parse_tool_calls(text: str, fmt: ToolCallFormat) -> ParsedTurn:
    if fmt == "hermes":
        return _parse_hermes(text)
    if fmt == "openai":
        return _parse_openai(text)
    raise ValueError(f"unknown tool call format {fmt!r} (known: {', '.join(TOOL_CALL_FORMATS)})")


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _reason(error: ValidationError | ValueError) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}" if where else first["msg"]
    return str(error)


def _parse_hermes(text: str) -> ParsedTurn:
    calls: list[ParsedCall] = []
    malformed: list[MalformedCall] = []
    for match in _HERMES_BLOCK.finditer(text):
        body = match.group(1).strip()
        try:
            call = _HermesCall.model_validate_json(body)
        except ValidationError as error:
            malformed.append(MalformedCall(_shown(body), _reason(error)))
            continue
        calls.append(ParsedCall(call.name, json.dumps(call.arguments), call.arguments))
    # What the blocks leave: an opening tag never closed, or a closing tag never opened.
    rest = _HERMES_BLOCK.sub("", text)
    if _HERMES_OPEN in rest:
        tail = rest[rest.index(_HERMES_OPEN) :]
        malformed.append(MalformedCall(_shown(tail), f"{_HERMES_OPEN} is never closed"))
    elif _HERMES_CLOSE in rest:
        malformed.append(MalformedCall(_shown(rest), f"{_HERMES_CLOSE} without {_HERMES_OPEN}"))
    return ParsedTurn(tuple(calls), tuple(malformed))


def _parse_openai(text: str) -> ParsedTurn:
    body = text.strip()
    if not body.startswith("{"):
        return ParsedTurn()  # a plain answer
    try:
        decoded = json.loads(body)
    except json.JSONDecodeError as error:
        # An object the model started but did not finish is a call it botched, not an answer.
        if '"tool_calls"' in body:
            return ParsedTurn(malformed=(MalformedCall(_shown(body), f"not JSON: {error}"),))
        return ParsedTurn()
    if not isinstance(decoded, dict) or "tool_calls" not in decoded:
        return ParsedTurn()
    try:
        message = _OpenAIMessage.model_validate(decoded)
    except ValidationError as error:
        return ParsedTurn(malformed=(MalformedCall(_shown(body), _reason(error)),))
    return ParsedTurn(
        tuple(
            ParsedCall(
                call.function.name,
                call.function.arguments,
                json.loads(call.function.arguments),
                call_id=call.id,
            )
            for call in message.tool_calls
        )
    )


class ThinkingProblem(enum.StrEnum):
    UNCLOSED = "unclosed"
    UNOPENED = "unopened"
    REPEATED = "repeated"
    NOT_FIRST = "not_first"


_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def thinking_problem(turn_text: str) -> ThinkingProblem | None:
    """What is wrong with a turn's thinking block, or None (also when it has none).

    A well-formed turn has at most one ``<think>…</think>`` block, first in the turn (leading
    whitespace aside): what a reasoning template's parser can split off the answer.
    """
    opens, closes = turn_text.count(_THINK_OPEN), turn_text.count(_THINK_CLOSE)
    if opens == 0 and closes == 0:
        return None
    if opens > 1 or closes > 1:
        return ThinkingProblem.REPEATED
    if closes == 0:
        return ThinkingProblem.UNCLOSED
    if opens == 0 or turn_text.index(_THINK_CLOSE) < turn_text.index(_THINK_OPEN):
        return ThinkingProblem.UNOPENED
    if not turn_text.lstrip().startswith(_THINK_OPEN):
        return ThinkingProblem.NOT_FIRST
    return None
