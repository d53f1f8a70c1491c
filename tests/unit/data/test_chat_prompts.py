"""Prompts through a chat template (``data.system_prompt``, ``policy.tokenizer.chat_template``,
chat datasets), with the real tokenizers of the tiny models: what the dispatcher publishes is
``tokenizer.apply_chat_template(conversation, add_generation_prompt=True)``."""

from __future__ import annotations

import json

import pytest

from dockyard.broker.memory import MemoryPlane
from dockyard.broker.typed import MessagePlane
from dockyard.cli import CliError
from dockyard.commands._common import EXIT_INVALID_CONFIG
from dockyard.commands._roles import prepare_trainer
from dockyard.config.loader import load_config
from dockyard.data.base import ChatMessage, PromptRecord
from dockyard.data.chat import CHATML, PromptFormat, PromptFormatError, render_prompt
from dockyard.models import load_tokenizer
from dockyard.producers.dispatcher import Dispatcher
from dockyard.schemas import PromptGroup

BPE = "tiny://qwen2-bpe"  # a byte-level BPE; its tokenizer adds no BOS
CHARS = "tiny://qwen2-arithmetic"  # character-level; its tokenizer adds BOS itself


def quickstart(*overrides: str):
    return load_config(
        "configs/quickstart.yaml",
        [
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=2",
            "policy.train_global_batch_size=4",
            "policy.train_micro_batch_size=4",
            "grpo.async_grpo.max_trajectory_age_steps=1",
            "data.max_input_seq_length=512",  # the quickstart's 8 fits `a+b=` only
            "policy.max_total_sequence_length=1024",
            *overrides,
        ],
    )


async def dispatch_all(config, inputs) -> list[PromptGroup]:
    async with MemoryPlane() as plane:
        dispatcher = Dispatcher(
            config, MessagePlane(plane, stage="d"), inputs.dataset, inputs.tokenizer, run_id="r"
        )
        await dispatcher.top_up(in_flight=0, weight_version=0)
        received = await MessagePlane(plane, stage="t").fetch(
            plane.names.prompt_consumer, PromptGroup, batch=10, timeout_s=0.1
        )
    groups = [item.message for item in received]
    assert groups, "nothing was dispatched"
    return groups


async def test_system_prompt_and_chatml_reach_the_dispatched_tokens():
    config = quickstart(
        f"policy.model_name={BPE}",
        "data.system_prompt=Answer with the sum.",
        "policy.tokenizer.chat_template=chatml",
    )
    groups = await dispatch_all(config, prepare_trainer(config))
    tokenizer = load_tokenizer(BPE)
    for group in groups:
        question = group.prompt_text.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        # ChatML, as the format defines it, ending with the assistant's open turn.
        assert group.prompt_text == (
            "<|im_start|>system\nAnswer with the sum.<|im_end|>\n"
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )
        assert question.endswith("=") and "+" in question  # the arithmetic prompt itself
        expected = tokenizer.apply_chat_template(
            [
                {"role": "system", "content": "Answer with the sum."},
                {"role": "user", "content": question},
            ],
            chat_template=CHATML,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert list(group.prompt_token_ids) == list(expected)


async def test_without_chat_settings_the_prompt_is_sent_as_written():
    config = quickstart()
    groups = await dispatch_all(config, prepare_trainer(config))
    tokenizer = load_tokenizer(CHARS)
    for group in groups:
        assert "<|im_start|>" not in group.prompt_text and group.prompt_text.endswith("=")
        assert list(group.prompt_token_ids) == tokenizer(group.prompt_text)["input_ids"]


async def test_a_chat_dataset_uses_the_tokenizers_own_template(tmp_path, monkeypatch):
    path = tmp_path / "chat.jsonl"
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}]
    path.write_text(json.dumps({"messages": chat, "answer": "4"}) + "\n")
    own = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    tokenizer = load_tokenizer(BPE)
    tokenizer.chat_template = own  # a tokenizer that ships its template
    monkeypatch.setattr("dockyard.models.load_tokenizer", lambda *args: tokenizer)
    config = quickstart(
        f"policy.model_name={BPE}",
        "data.train.name=chat",
        f"data.train.path={path}",
        "~data.train.params",
        "data.train.fields.messages=messages",
    )
    (group,) = await dispatch_all(config, prepare_trainer(config))
    assert group.prompt_text == "[system] Be terse.\n[user] 2+2?\n[assistant]"
    assert group.ground_truth == "4"


def test_the_configured_template_overrides_the_tokenizers():
    tokenizer = load_tokenizer(BPE)
    tokenizer.chat_template = "{{ 'OWN' }}"
    fmt = PromptFormat(chat_template="{% for m in messages %}<{{ m['content'] }}>{% endfor %}")
    record = PromptRecord(index=0, prompt="hi", ground_truth="", env="math")
    assert render_prompt(record, fmt, tokenizer) == "<hi>"


def test_a_template_writing_bos_gives_one_bos_with_a_tokenizer_that_adds_it():
    tokenizer = load_tokenizer(CHARS)
    fmt = PromptFormat(
        chat_template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    record = PromptRecord(index=0, prompt="1+2=", ground_truth="3", env="math")
    ids = tokenizer(render_prompt(record, fmt, tokenizer))["input_ids"]
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    assert ids == [
        tokenizer.bos_token_id,
        *tokenizer("1+2=", add_special_tokens=False)["input_ids"],
    ]


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["data.system_prompt=be brief"],
            "policy.tokenizer.chat_template: the prompts need a chat template",
        ),
        (
            ["policy.tokenizer.chat_template=mistral"],
            "policy.tokenizer.chat_template: 'mistral' is neither",
        ),
        (
            ['policy.tokenizer.chat_template="{{ undefined_fn() }}"'],
            "policy.tokenizer.chat_template: the chat template failed",
        ),
    ],
)
def test_launch_refuses_prompts_it_cannot_format(overrides, says):
    # The tiny tokenizers ship no chat template.
    with pytest.raises(CliError) as refused:
        prepare_trainer(quickstart(*overrides))
    assert refused.value.exit_code == EXIT_INVALID_CONFIG
    assert str(refused.value).startswith(says)


def chat_record(*messages: ChatMessage, index: int = 0, env: str = "math") -> PromptRecord:
    return PromptRecord(index=index, prompt="", ground_truth="", env=env, messages=messages)


def test_a_system_prompt_over_a_record_with_one_is_refused():
    record = chat_record(ChatMessage("system", "a"), ChatMessage("user", "b"), index=3)
    with pytest.raises(PromptFormatError, match="record 3 already starts with a system message"):
        render_prompt(record, PromptFormat("b", "{{ 'x' }}"), load_tokenizer(BPE))


# A multimodal template's shape (Qwen2-VL's): a message's content is a string or a list of
# parts, an image part written as the model's image placeholder.
PARTS_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}] {% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{% if p.type == 'image' %}<image>{% else %}{{ p.text }}"
    "{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}[assistant] "
)


def test_a_message_showing_images_renders_its_image_parts_before_its_text():
    record = chat_record(
        ChatMessage("system", "Be brief."), ChatMessage("user", "Click OK.", images=2)
    )
    fmt = PromptFormat(chat_template=PARTS_TEMPLATE)
    rendered = render_prompt(record, fmt, load_tokenizer(BPE))
    assert rendered == "[system] Be brief.\n[user] <image><image>Click OK.\n[assistant] "


def test_a_tool_block_opens_the_text_of_a_message_showing_images_not_its_image_parts():
    # The template ignores tools=: the plain-text block goes at the start of the first user
    # message's text, after its image parts (which stay where the data put them).
    from dockyard.data.tool_turns import ToolPrompts, plain_tool_block
    from dockyard.environments.tools.calculator import CALCULATOR_SCHEMA

    schemas = (CALCULATOR_SCHEMA,)
    record = chat_record(ChatMessage("user", "Click OK.", images=1), env="osworld")
    fmt = PromptFormat(
        chat_template=PARTS_TEMPLATE, tool_prompts=ToolPrompts("hermes", {"osworld": schemas})
    )
    rendered = render_prompt(record, fmt, load_tokenizer(BPE))
    block = plain_tool_block(schemas, "hermes")
    assert rendered == f"[user] <image>{block}Click OK.\n[assistant] "
