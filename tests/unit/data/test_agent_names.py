"""Agent names in data (issue #27): a file record names its agent through ``fields.agent``, any
dataset (built-in generators included) can be given one with ``agent_name``, and the name rides
the wire as ``PromptGroup.agent`` — the key the teacher scorer routes on under OPD."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError
from dockyard.data.catalog import build_dataset
from dockyard.models import build_character_tokenizer
from dockyard.producers.prompts import make_prompt_group
from dockyard.schemas import PromptGroup, decode, encode

ROWS = [
    {"prompt": "12+30=", "answer": "42", "domain": "adder"},
    {"prompt": "321", "answer": "123", "domain": "reverser"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_each_file_record_carries_the_agent_its_field_names(tmp_path):
    path = write_jsonl(tmp_path / "mix.jsonl", ROWS)
    dataset = build_dataset(
        DatasetConfig(name="mix", path=str(path), fields={"agent": "domain"}), "teacher"
    )
    assert [dataset[i].agent_name for i in range(len(dataset))] == ["adder", "reverser"]
    # Without the mapping, the same file's records are the default agent's.
    unmapped = build_dataset(DatasetConfig(name="mix", path=str(path)), "teacher")
    assert {unmapped[i].agent_name for i in range(len(unmapped))} == {"default"}


@pytest.mark.parametrize(
    ("value", "shown"), [(None, "None"), ("", "''"), (7, "7"), (["adder"], "['adder']")]
)
def test_an_agent_that_is_not_a_non_empty_string_is_refused_with_its_record(tmp_path, value, shown):
    rows = [ROWS[0], {**ROWS[1], "domain": value}]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetError) as error:
        build_dataset(DatasetConfig(name="m", path=str(path), fields={"agent": "domain"}), "math")
    assert error.value.key == "fields.agent"
    assert f"record 1 of {path}" in str(error.value) and shown in str(error.value)


def test_a_missing_agent_field_is_refused_with_its_key(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DatasetError) as error:
        build_dataset(DatasetConfig(name="m", path=str(path), fields={"agent": "who"}), "math")
    assert error.value.key == "fields.agent" and "no field 'who'" in str(error.value)


def test_agent_name_renames_every_record_of_a_built_in_generator():
    config = DatasetConfig(
        name="arithmetic", max_samples=5, params={"low": 10, "high": 20}, agent_name="adder"
    )
    dataset = build_dataset(config, "teacher")
    plain = build_dataset(config.model_copy(update={"agent_name": None}), "teacher")
    assert len(dataset) == 5 and {dataset[i].agent_name for i in range(5)} == {"adder"}
    # Only the agent changes: the prompts and answers are the generator's own.
    assert [(dataset[i].prompt, dataset[i].ground_truth) for i in range(5)] == [
        (plain[i].prompt, plain[i].ground_truth) for i in range(5)
    ]
    assert dataset.name == plain.name


def test_agent_name_and_fields_agent_together_are_refused():
    with pytest.raises(ValidationError, match="agent_name"):
        DatasetConfig(name="m", path="x.jsonl", fields={"agent": "domain"}, agent_name="adder")


def test_an_empty_agent_name_is_refused():
    with pytest.raises(ValidationError, match="agent_name"):
        DatasetConfig(name="arithmetic", agent_name="")


def test_the_agent_name_rides_the_wire(tmp_path):
    tokenizer = build_character_tokenizer()
    path = write_jsonl(tmp_path / "mix.jsonl", [ROWS[0]])
    record = build_dataset(
        DatasetConfig(name="mix", path=str(path), fields={"agent": "domain"}), "teacher"
    )[0]
    group = make_prompt_group(
        record,
        tokenizer,
        run_id="r",
        dataset_name="mix/train",
        epoch=0,
        position=0,
        num_generations=2,
        weight_version=0,
    )
    decoded = decode(None, encode(group).payload, expected=PromptGroup)
    assert decoded.agent == "adder"
