"""Prompt formatting: a record's prompt (or chat) → the text the model is given.

A record is rendered with a chat template — ``tokenizer.apply_chat_template(...,
add_generation_prompt=True)`` — when the dataset writes its prompts as a chat
(``fields.messages``), when ``data.system_prompt`` is set, or when
``policy.tokenizer.chat_template`` is set; otherwise the prompt is sent as the dataset wrote it
(the quickstart's ``a+b=``). ``policy.tokenizer.chat_template`` overrides the tokenizer's own
template: a built-in name (:data:`BUILTIN_TEMPLATES`) or a Jinja string.

With structured tool use, the prompts of an environment that has a toolbox go through the chat
template whenever there is one, with the toolbox's tools described
(``grpo.structured_tool_use.describe_tools``): see :mod:`dockyard.data.tool_turns`.

The invariant every consumer relies on: ``tokenizer(record.prompt)["input_ids"]`` is the prompt's
tokens. Templates usually write the BOS token themselves, so when the tokenizer adds one too the
rendered text drops its own (as ``apply_chat_template(tokenize=True)`` does by tokenizing
without special tokens) — the dispatcher, the evaluator and SFT then all see the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dockyard.config.sections.data import DataConfig, DatasetConfig
from dockyard.config.sections.policy import TokenizerConfig
from dockyard.data.base import ChatMessage, Dataset, MappedDataset, PromptRecord
from dockyard.data.catalog import build_dataset
from dockyard.data.tool_turns import (
    Observations,
    TemplatedObservations,
    ToolPrompts,
    ToolSchemas,
    plain_tool_block,
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
BUILTIN_TEMPLATES: dict[str, str] = {"chatml": CHATML}

CHAT_TEMPLATE_KEY = "policy.tokenizer.chat_template"


class PromptFormatError(ValueError):
    """The prompts cannot be formatted as configured; ``key`` is the full key path to name."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class PromptFormat:
    system_prompt: str | None = None
    # Jinja source overriding the tokenizer's template; None = the tokenizer's own.
    chat_template: str | None = None
    tool_prompts: ToolPrompts | None = None

    @classmethod
    def from_config(
        cls, data: DataConfig, tokenizer: TokenizerConfig, tool_prompts: ToolPrompts | None = None
    ) -> PromptFormat:
        return cls(data.system_prompt, resolve_chat_template(tokenizer.chat_template), tool_prompts)

    def uses_tools(self, record: PromptRecord) -> bool:
        return self.tool_prompts is not None and record.env in self.tool_prompts.tools

    def renders(self, record: PromptRecord) -> bool:
        # Images reach the prompt only as the chat template's placeholders.
        return (
            bool(record.messages)
            or bool(record.images)
            or self.system_prompt is not None
            or bool(self.chat_template)
        )


def resolve_chat_template(value: str | None) -> str | None:
    """A built-in name → its Jinja source; a Jinja string as is; anything else is refused."""
    if value is None:
        return None
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    if "{{" in value or "{%" in value:
        return value
    raise PromptFormatError(
        CHAT_TEMPLATE_KEY,
        f"{value!r} is neither a built-in template ({', '.join(BUILTIN_TEMPLATES)}) nor a "
        "Jinja template string",
    )


def episode_observations(tokenizer_config: TokenizerConfig, tokenizer: Any) -> Observations | None:
    """How an episode shows the model its tool results: through the chat template when there
    is one (the prompts are rendered with it too); None: the plain convention. A
    ``ChatTemplateError`` when the template cannot render tool messages."""
    template = resolve_chat_template(tokenizer_config.chat_template) or getattr(
        tokenizer, "chat_template", None
    )
    return TemplatedObservations(tokenizer, template) if template else None


def conversation(record: PromptRecord, system_prompt: str | None) -> list[dict[str, Any]]:
    messages = list(record.messages) or [ChatMessage("user", record.prompt)]
    if system_prompt is not None:
        if messages[0].role == "system":
            # Two system messages would be a guess at which wins; the data and the config
            # disagree, and that is the user's to settle.
            raise PromptFormatError(
                "data.system_prompt",
                f"record {record.index} already starts with a system message; unset "
                "data.system_prompt or drop the record's system message",
            )
        messages.insert(0, ChatMessage("system", system_prompt))
    if record.images:
        # The record's images (fields.images) open the first user turn, before any image parts
        # the message has itself: each becomes the chat template's placeholder (Qwen2-VL:
        # <|vision_start|><|image_pad|><|vision_end|>).
        first = next(i for i, m in enumerate(messages) if m.role == "user")
        shown = messages[first].images + len(record.images)
        messages[first] = replace(messages[first], images=shown)
    return [{"role": m.role, "content": _content(m)} for m in messages]


def _content(message: ChatMessage) -> str | list[dict[str, str]]:
    """Text, or (a message showing images) its image parts then its text, as multimodal chat
    templates take them (each renders as the model's image placeholder)."""
    if not message.images:
        return message.content
    return [*([{"type": "image"}] * message.images), {"type": "text", "text": message.content}]


def render_prompt(record: PromptRecord, fmt: PromptFormat, tokenizer: object) -> str:
    """The text the model is given for ``record`` (see the module's invariant)."""
    template = fmt.chat_template or getattr(tokenizer, "chat_template", None)
    tools: ToolSchemas = ()
    if fmt.uses_tools(record):
        assert fmt.tool_prompts is not None
        tools = fmt.tool_prompts.tools[record.env]
        if not template:  # a tokenizer without a template: the documented plain-text fallback
            block = plain_tool_block(tools, fmt.tool_prompts.tool_call_format) if tools else ""
            if record.messages or fmt.system_prompt is not None:
                raise PromptFormatError(
                    CHAT_TEMPLATE_KEY,
                    "the prompts need a chat template (a chat dataset or data.system_prompt) "
                    f"and the tokenizer has none: set {CHAT_TEMPLATE_KEY} (e.g. chatml)",
                )
            return block + record.prompt
    elif not fmt.renders(record):
        return record.prompt
    if not template:
        raise PromptFormatError(
            CHAT_TEMPLATE_KEY,
            "the prompts need a chat template (a chat dataset or data.system_prompt) and the "
            f"tokenizer has none: set {CHAT_TEMPLATE_KEY} (e.g. chatml)",
        )
    try:
        messages = conversation(record, fmt.system_prompt)
        text = _apply(tokenizer, messages, template, tools)
        if tools and text == _apply(tokenizer, messages, template, ()):
            # The template ignores tools=: the plain-text block opens the first user message.
            assert fmt.tool_prompts is not None
            block = plain_tool_block(tools, fmt.tool_prompts.tool_call_format)
            first = next(i for i, m in enumerate(messages) if m["role"] != "system")
            messages[first] = _prepended(messages[first], block)
            text = _apply(tokenizer, messages, template, ())
    except PromptFormatError:
        raise
    except Exception as error:  # jinja2 raises template and undefined errors of many types
        raise PromptFormatError(
            CHAT_TEMPLATE_KEY, f"the chat template failed on record {record.index}: {error}"
        ) from None
    return _without_duplicate_bos(str(text), tokenizer)


def _prepended(message: dict[str, Any], text: str) -> dict[str, Any]:
    """``message`` with ``text`` at the start of its text (after its image parts)."""
    content = message["content"]
    if isinstance(content, str):
        return {**message, "content": text + content}
    *images, last = content
    return {**message, "content": [*images, {**last, "text": text + last["text"]}]}


def _apply(
    tokenizer: object, messages: list[dict[str, Any]], template: str, tools: ToolSchemas
) -> str:
    text = tokenizer.apply_chat_template(  # type: ignore[attr-defined]  # a transformers tokenizer, typed object here
        messages,
        tools=[dict(tool) for tool in tools] or None,
        chat_template=template,
        add_generation_prompt=True,
        tokenize=False,
    )
    return str(text)


def _without_duplicate_bos(text: str, tokenizer: object) -> str:
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or not text.startswith(bos):
        return text
    adds_bos = tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]  # type: ignore[operator,attr-defined]  # a transformers tokenizer, typed object here
    return text[len(bos) :] if adds_bos else text


def format_dataset(dataset: Dataset, fmt: PromptFormat, tokenizer: object) -> Dataset:
    """The dataset as the model sees it; the first record is rendered now, so a missing or
    broken template is refused at launch rather than at the first dispatch."""
    formatted = MappedDataset(
        dataset,
        lambda record: replace(record, prompt=render_prompt(record, fmt, tokenizer), messages=()),
    )
    if len(formatted):
        formatted[0]
    return formatted


def build_prompt_dataset(
    section: DatasetConfig,
    data: DataConfig,
    tokenizer_config: TokenizerConfig,
    tokenizer: object,
    tool_prompts: ToolPrompts | None = None,
) -> Dataset:
    """A ``data.*`` / ``sft.dev_dataset`` entry as the model sees it (built, then formatted)."""
    dataset = build_dataset(section, data.default_env, data.default_processor)
    fmt = PromptFormat.from_config(data, tokenizer_config, tool_prompts)
    return format_dataset(dataset, fmt, tokenizer)
