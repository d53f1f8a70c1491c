"""Processors (``data.*.processor``, ``data.default_processor``): the instruction each adds to a
record's task, where it goes in a chat, and unknown names refused when the config loads."""

from __future__ import annotations

import pytest

from dockyard.commands._roles import prepare_trainer
from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config
from dockyard.config.sections.data import PROCESSORS, DatasetConfig
from dockyard.data.base import ChatMessage, PromptRecord
from dockyard.data.catalog import build_dataset
from dockyard.data.processors import INSTRUCTIONS, process_record
from tests.integration.e2e.conftest import QUICKSTART, ROOT

HLE = ROOT / "configs" / "cpu" / "data" / "hle.jsonl"
BOXED = "Put your final answer within \\boxed{}."


def test_every_processor_the_config_accepts_is_built_in():
    assert set(PROCESSORS) == {"default", *INSTRUCTIONS}


def test_a_text_prompt_gets_the_instruction_after_it():
    record = PromptRecord(index=0, prompt="What is 2+3?", ground_truth="5", env="math")
    assert process_record(record, BOXED).prompt == f"What is 2+3?\n\n{BOXED}"


def test_a_chat_gets_it_in_its_last_user_message():
    chat = (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", "What is 2+3?"),
    )
    record = PromptRecord(0, "", "5", "math", messages=chat)
    processed = process_record(record, BOXED).messages
    assert processed[:3] == chat[:3]
    assert processed[3] == ChatMessage("user", f"What is 2+3?\n\n{BOXED}")
    system_only = PromptRecord(0, "", "5", "math", messages=chat[:1])
    assert process_record(system_only, BOXED).messages == (chat[0], ChatMessage("user", BOXED))


def test_a_dataset_uses_its_own_processor_else_the_default():
    fields = {"prompt": "question", "metadata": ["answer_type"]}
    own = DatasetConfig(name="hle", path=str(HLE), fields=fields, processor="python_program")
    plain = DatasetConfig(name="hle", path=str(HLE), fields=fields)
    question = build_dataset(plain, "hle")[0].prompt
    assert build_dataset(own, "hle", "boxed_answer")[0].prompt.endswith(
        INSTRUCTIONS["python_program"]
    )
    assert build_dataset(plain, "hle", "boxed_answer")[0].prompt == f"{question}\n\n{BOXED}"
    assert build_dataset(plain, "hle")[0].prompt == question  # "default": as it is


def test_the_dispatched_prompts_carry_the_instruction():
    config = load_config(QUICKSTART, ["data.default_processor=shell_script"])
    inputs = prepare_trainer(config)
    assert inputs.dataset[0].prompt.endswith("\n\n" + INSTRUCTIONS["shell_script"])


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("data.default_processor=boxed", "data.default_processor"),
        ("data.train.processor=chatml", "data.train.processor"),
        ("+sft.dev_dataset.processor=nope", "sft.dev_dataset.processor"),
    ],
)
def test_an_unknown_processor_is_refused_with_its_key_path(override, path):
    with pytest.raises(ConfigError) as refused:
        load_config(QUICKSTART, [override])
    assert f"{path}: unknown processor" in str(refused.value)
    assert "built in: default, boxed_answer, python_program, shell_script" in str(refused.value)
