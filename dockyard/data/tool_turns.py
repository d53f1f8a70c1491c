"""Tools in the conversation: their descriptions in the prompt, their results after a turn.

With ``grpo.structured_tool_use.enabled``, the prompts of an environment with a toolbox and the
observations of its episodes are written the way the model's chat template writes them, when
there is one (``policy.tokenizer.chat_template``, else the tokenizer's own):

- the prompt: ``tokenizer.apply_chat_template(messages, tools=schemas,
  add_generation_prompt=True)`` — the template renders the toolbox's tool schemas (OpenAI
  function schemas, :meth:`Toolbox.tool_schemas`) its own way (Qwen2.5 and Hermes templates as a
  ``<tools>`` block in the system message). A template that ignores ``tools=`` (its output is the
  same without them) gets the plain-text block below at the start of the first user message.
- an observation: the turn's results as ``tool``-role messages after the model's turn, rendered
  by the same template with the generation prompt: the text the template writes after the
  assistant's end-of-turn token, the results in their place (Qwen2.5:
  ``\\n<|im_start|>user\\n<tool_response>\\n…\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n``).
  The template's own pieces are tokenized with their special tokens; the tool's text never is
  (a literal ``<|im_end|>`` in a tool's output stays text).

Without a chat template (the tiny tokenizers built in code): the prompt is the dataset's text,
after a plain-text tool block when tools are described (:func:`plain_tool_block`), and an
observation is the call format's own convention (:func:`render_observation`): Hermes
``<tool_response>`` blocks or OpenAI ``tool`` messages as JSON lines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

#: The tools an environment's prompts describe (OpenAI function schemas).
ToolSchemas = tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class ToolPrompts:
    """The environments whose episodes call tools (structured tool use), each with the tools
    its prompts describe (none when ``describe_tools`` is off), and the call format."""

    tool_call_format: str
    tools: Mapping[str, ToolSchemas]


@dataclass(frozen=True)
class ToolResult:
    """One call's result as the model reads it; ``images``: how many images it shows after its
    text (a screenshot), as image content parts of its tool message."""

    call_id: str
    name: str
    text: str
    images: int = 0


def render_observation(fmt: str, results: Sequence[ToolResult]) -> str:
    """The plain observation of a turn's results, in the call format's own convention: Hermes
    ``<tool_response>`` blocks, or OpenAI ``tool`` messages as JSON lines."""
    if fmt == "hermes":
        return "".join(f"<tool_response>\n{r.text}\n</tool_response>\n" for r in results)
    return "".join(
        json.dumps({"role": "tool", "tool_call_id": r.call_id, "content": r.text}) + "\n"
        for r in results
    )


_HOW_TO_CALL = {
    "hermes": (
        'To call a tool, write <tool_call>{"name": <tool name>, "arguments": <arguments '
        "object>}</tool_call>; each result comes back in a <tool_response> block."
    ),
    "openai": (
        'To call tools, answer with only a JSON object {"tool_calls": [{"id": <id>, "type": '
        '"function", "function": {"name": <tool name>, "arguments": <arguments as JSON '
        'text>}}]}; each result comes back as a {"role": "tool"} JSON line.'
    ),
}


def plain_tool_block(schemas: ToolSchemas, fmt: str) -> str:
    """The tools as plain text, for prompts without a chat template: one JSON line per tool
    (its name, description and argument schema), then how to call one in ``fmt``."""
    lines = [json.dumps(schema.get("function", schema), sort_keys=True) for schema in schemas]
    return (
        "You can call these tools:\n<tools>\n"
        + "\n".join(lines)
        + f"\n</tools>\n{_HOW_TO_CALL[fmt]}\n\n"
    )


class TokenCodec(Protocol):
    def encode(
        self, text: str, add_special_tokens: bool = ..., split_special_tokens: bool = ...
    ) -> list[int]: ...


def untrusted_ids(codec: TokenCodec, text: str) -> list[int]:
    """Tool output as tokens: special-token text stays text (a tool could otherwise end the
    turn or forge one of the model's)."""
    return codec.encode(text, add_special_tokens=False, split_special_tokens=True)


class Observations(Protocol):
    def token_ids(self, results: Sequence[ToolResult], turn_closed: bool = True) -> list[int]:
        """The tokens appended after the model's turn for its results; ``turn_closed``: the
        turn's last token is the EOS the template ends an assistant turn with."""
        ...


@dataclass(frozen=True)
class PlainObservations:
    """Observations without a chat template (:func:`render_observation`)."""

    codec: TokenCodec
    tool_call_format: str

    def token_ids(self, results: Sequence[ToolResult], turn_closed: bool = True) -> list[int]:
        if any(result.images for result in results):
            # Plain text has no image parts: the image would be silently left out.
            raise ChatTemplateError(
                "tool results that show images need a chat template that renders image parts"
            )
        return untrusted_ids(self.codec, render_observation(self.tool_call_format, results))


class ChatTemplateError(ValueError):
    """The chat template cannot write tool turns (named with its key by the caller)."""


# Placeholders the template renders in place of the texts; never in a real template.
_TURN = "\x00dockyard-assistant-turn\x00"
_RESULT = "\x00dockyard-result-{}\x00"


class TemplatedObservations:
    """Observations as ``tool``-role messages through the chat template (see the module)."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self.tokenizer = tokenizer
        self.template = template
        eos = getattr(tokenizer, "eos_token", None)
        # The model's turn ends with the token it stopped on (its EOS, in the episode's tokens):
        # what the template writes after the assistant's text must start with it.
        probe = self._render([ToolResult("probe", "probe", "probe")])
        after_turn = probe[probe.index(_TURN) + len(_TURN) :]
        if not eos or not after_turn.startswith(eos):
            raise ChatTemplateError(
                f"the chat template does not end an assistant turn with the EOS token {eos!r} "
                "(the token a model's turn stops on), so a tool turn cannot follow one"
            )
        self.eos = eos

    def _render(self, results: Sequence[ToolResult]) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": _TURN},
        ]
        messages += [
            {
                "role": "tool",
                "tool_call_id": result.call_id,
                "name": result.name,
                "content": _content(_RESULT.format(index), result.images),
            }
            for index, result in enumerate(results)
        ]
        try:
            text = self.tokenizer.apply_chat_template(
                messages, chat_template=self.template, add_generation_prompt=True, tokenize=False
            )
        except Exception as error:  # jinja2 raises template and undefined errors of many types
            raise ChatTemplateError(f"the chat template fails on tool messages: {error}") from None
        return str(text)

    def check_images(self, image_token: str) -> None:
        """ChatTemplateError unless the template renders a tool message's image parts, one
        ``image_token`` each (checked at launch: an image left out would be a silent drop)."""
        probe = self._render([ToolResult("probe", "probe", "probe", images=2)])
        shown = probe[probe.index(_TURN) :].count(image_token)
        if shown != 2:
            raise ChatTemplateError(
                f"the chat template renders {shown} {image_token!r} for a tool message with two "
                "image parts, not one each, so a screenshot in a tool turn cannot be shown"
            )

    def token_ids(self, results: Sequence[ToolResult], turn_closed: bool = True) -> list[int]:
        text = self._render(results)
        # A turn stopped by a stop string has no EOS yet: the template's is written for it.
        text = text[text.index(_TURN) + len(_TURN) + (len(self.eos) if turn_closed else 0) :]
        ids: list[int] = []
        for index, result in enumerate(results):
            marker = _RESULT.format(index)
            if marker not in text:
                raise ChatTemplateError(f"the chat template dropped tool message {index}")
            trusted, text = text.split(marker, 1)
            ids += self._trusted_ids(trusted)
            ids += untrusted_ids(self.tokenizer, result.text)
        return ids + self._trusted_ids(text)

    def _trusted_ids(self, text: str) -> list[int]:
        """The template's own text: its special tokens are the template's to write."""
        return [int(token) for token in self.tokenizer.encode(text, add_special_tokens=False)]


def _content(text: str, images: int) -> str | list[dict[str, str]]:
    """A tool message's content: its text, then one image part per image it shows (the parts
    multimodal chat templates render as their image placeholder)."""
    if not images:
        return text
    return [{"type": "text", "text": text}, *([{"type": "image"}] * images)]
