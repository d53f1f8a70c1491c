"""File datasets (``data.*.path``): JSONL, Parquet and a ``save_to_disk`` directory read from
real files, the field mapping, ``split``/``max_samples``, and refusals that name the key, the
record and the file — at launch, with exit status 2."""

from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dockyard.cli import CliError
from dockyard.commands._common import EXIT_INVALID_CONFIG
from dockyard.commands._roles import prepare_trainer
from dockyard.config.loader import load_config
from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError
from dockyard.data.catalog import build_dataset

ROWS = [
    {"question": "What is 2+3?", "solution": "5", "level": 1},
    {"question": "What is 7*6?", "solution": 42, "level": 2},
    {"question": "Simplify 4/8.", "solution": "\\frac{1}{2}", "level": 3},
]
MAPPING = {"prompt": "question", "answer": "solution", "metadata": ["level"]}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def section(path, **extra) -> DatasetConfig:
    return DatasetConfig(name="mine", path=str(path), fields=MAPPING, **extra)


def assert_rows(dataset, rows=ROWS):
    assert [
        (r.prompt, r.ground_truth, r.extra) for r in (dataset[i] for i in range(len(dataset)))
    ] == [(row["question"], str(row["solution"]), {"level": row["level"]}) for row in rows]


def test_jsonl_records_follow_the_field_mapping(tmp_path):
    dataset = build_dataset(section(write_jsonl(tmp_path / "d.jsonl", ROWS)), "math")
    assert_rows(dataset)
    assert dataset.name == "mine/train"
    assert {dataset[i].env for i in range(3)} == {"math"}


def test_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.Table.from_pylist([{**r, "solution": str(r["solution"])} for r in ROWS]), path
    )
    assert_rows(build_dataset(section(path), "math"))


def test_saved_datasets_dict_selects_the_split(tmp_path):
    rows = [{**r, "solution": str(r["solution"])} for r in ROWS]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows[:2]),
            "test": datasets.Dataset.from_list(rows[2:]),
        }
    ).save_to_disk(str(tmp_path / "saved"))
    assert_rows(build_dataset(section(tmp_path / "saved"), "math"), ROWS[:2])
    assert_rows(build_dataset(section(tmp_path / "saved", split="test"), "math"), ROWS[2:])
    with pytest.raises(DatasetError) as refused:
        build_dataset(section(tmp_path / "saved", split="validation"), "math")
    assert refused.value.key == "split" and "test, train" in str(refused.value)


def test_split_placeholder_picks_the_file_and_max_samples_keeps_the_first(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "validation.jsonl", ROWS[1:])
    template = tmp_path / "{split}.jsonl"
    assert_rows(build_dataset(section(template, split="validation"), "math"), ROWS[1:])
    assert_rows(build_dataset(section(template, max_samples=2), "math"), ROWS[:2])


def test_messages_field_gives_a_chat_record(tmp_path):
    rows = [{"chat": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    config = DatasetConfig(name="c", path=str(write_jsonl(tmp_path / "c.jsonl", rows)))
    config.fields.messages = "chat"
    record = build_dataset(config, "math")[0]
    assert [(m.role, m.content) for m in record.messages] == [("user", "2+2?")]
    assert record.ground_truth == "4"


def test_a_message_with_image_parts_keeps_where_its_images_go(tmp_path):
    content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which differs?"}]
    rows = [{"chat": [{"role": "user", "content": content}], "answer": "b"}]
    config = DatasetConfig(name="c", path=str(write_jsonl(tmp_path / "c.jsonl", rows)))
    config.fields.messages = "chat"
    [message] = build_dataset(config, "math")[0].messages
    assert (message.role, message.content, message.images) == ("user", "Which differs?", 2)


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "text", "text": "after"}, {"type": "image"}],  # where would the image go?
        [{"type": "image"}],  # no text
        [{"type": "image", "url": "file:///etc/passwd"}, {"type": "text", "text": "x"}],
        [{"type": "text", "text": 3}],
        [],
    ],
)
def test_content_parts_other_than_images_then_text_are_refused_with_the_key(tmp_path, content):
    rows = [{"chat": [{"role": "user", "content": content}], "answer": "b"}]
    config = DatasetConfig(name="c", path=str(write_jsonl(tmp_path / "c.jsonl", rows)))
    config.fields.messages = "chat"
    with pytest.raises(DatasetError, match="image") as refused:
        build_dataset(config, "math")[0]
    assert refused.value.key == "fields.messages"


@pytest.mark.parametrize(
    ("rows", "key", "says"),
    [
        (
            [ROWS[0], {"question": "q"}],
            "fields.answer",
            "record 1 of {file} has no field 'solution'",
        ),
        (
            [{"solution": "1", "level": 1}],
            "fields.prompt",
            "record 0 of {file} has no field 'question'",
        ),
        ([{**ROWS[0], "level": [1]}], "fields.metadata", "metadata field 'level' is a list"),
        # json reads NaN and Infinity; a prompt group's extra holds JSON values only
        (
            [{**ROWS[0], "level": float("nan")}],
            "fields.metadata",
            "metadata field 'level' is nan, not a finite number",
        ),
        (
            [{**ROWS[0], "level": float("-inf")}],
            "fields.metadata",
            "metadata field 'level' is -inf, not a finite number",
        ),
        ([{**ROWS[0], "solution": None}], "fields.answer", "field 'solution' is a NoneType"),
        ([{**ROWS[0], "question": ""}], "fields.prompt", "'question' is not a non-empty string"),
        ([], "path", "{file} holds no records"),
    ],
)
def test_bad_records_are_refused_naming_field_record_and_file(tmp_path, rows, key, says):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DatasetError) as refused:
        build_dataset(section(path), "math")
    assert refused.value.key == key
    assert says.format(file=path) in str(refused.value)


def test_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n")
    with pytest.raises(DatasetError, match=r"record 1 \(line 3\) of .*invalid JSON"):
        build_dataset(section(path), "math")


@pytest.mark.parametrize(
    ("chat", "says"),
    [
        ("not a list", "not a non-empty list"),
        ([{"role": "wizard", "content": "x"}], "message 0: expected {role, content}"),
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
            "ends with an assistant",
        ),
    ],
)
def test_malformed_chats_are_refused(tmp_path, chat, says):
    path = write_jsonl(tmp_path / "c.jsonl", [{"chat": chat, "answer": "1"}])
    config = DatasetConfig(name="c", path=str(path), fields={"messages": "chat"})
    with pytest.raises(DatasetError, match=says) as refused:
        build_dataset(config, "math")
    assert refused.value.key == "fields.messages"


def test_missing_file_unknown_format_and_misplaced_keys_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        build_dataset(section(tmp_path / "none.jsonl"), "math")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"unsupported format '\.csv'"):
        build_dataset(section(tmp_path / "d.csv"), "math")
    with pytest.raises(DatasetError, match="built-in dataset") as refused:
        build_dataset(DatasetConfig(name="arithmetic", path=str(tmp_path / "x.jsonl")), "math")
    assert refused.value.key == "path"
    with pytest.raises(DatasetError, match="file datasets") as refused:
        build_dataset(DatasetConfig(name="arithmetic", fields={"answer": "x"}), "math")
    assert refused.value.key == "fields"


def test_a_built_in_dataset_written_out_with_every_default_still_builds():
    # dockyard run hands its roles the resolved config with every key written out, the default
    # field mapping included: that is no mapping, and the built-in set builds.
    written = DatasetConfig(name="arithmetic").model_dump(mode="json")
    assert "fields" in written
    dataset = build_dataset(DatasetConfig.model_validate(written), "arithmetic")
    assert len(dataset) > 0


def quickstart(*overrides: str):
    return load_config("configs/quickstart.yaml", list(overrides))


def test_launch_reads_the_file_dataset(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    config = quickstart(
        "data.train.name=mine",
        f"data.train.path={path}",
        "~data.train.params",
        "data.train.fields.prompt=question",
        "data.train.fields.answer=solution",
    )
    inputs = prepare_trainer(config)
    assert [inputs.dataset[i].prompt for i in range(3)] == [row["question"] for row in ROWS]


@pytest.mark.parametrize("dataset_key", ["data.train", "data.validation"])
def test_launch_refuses_a_bad_record_with_its_key_path(tmp_path, dataset_key):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "x"}])
    config = quickstart(
        f"{dataset_key}.name=mine", f"{dataset_key}.path={path}", f"~{dataset_key}.params"
    )
    with pytest.raises(CliError) as refused:
        prepare_trainer(config)
    assert refused.value.exit_code == EXIT_INVALID_CONFIG
    assert str(refused.value).startswith(
        f"{dataset_key}.fields.answer: record 1 of {path} has no field 'answer'"
    )


def dispatcher_over(config, plane):
    from dockyard.broker.typed import MessagePlane
    from dockyard.producers.dispatcher import Dispatcher

    inputs = prepare_trainer(config)
    return Dispatcher(
        config, MessagePlane(plane, stage="d"), inputs.dataset, inputs.tokenizer, run_id="r"
    )


def file_run(path):
    return quickstart(
        "data.train.name=mine",
        f"data.train.path={path}",
        "~data.train.params",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=4",
        "grpo.async_grpo.max_trajectory_age_steps=1",  # capacity: 4 groups per top-up
        "grpo.max_num_epochs=2",
    )


async def test_a_resumed_file_dataset_continues_where_the_checkpoint_stopped(tmp_path):
    from dockyard.broker.memory import MemoryPlane

    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10, 16)]
    config = file_run(write_jsonl(tmp_path / "d.jsonl", rows))
    async with MemoryPlane() as plane:
        straight = dispatcher_over(config, plane)
        whole = [*await straight.top_up(0, 0), *await straight.top_up(0, 0)]
        first = dispatcher_over(config, plane)
        head = await first.top_up(0, 0)
        saved = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
        resumed = dispatcher_over(config, plane)
        resumed.load_state_dict(saved)
        tail = await resumed.top_up(0, 0)
    assert head + tail == whole  # nothing dispatched twice, nothing skipped
    # 6 records: epoch 0 is all of them once, then epoch 1 begins
    assert sorted(whole[:6]) == sorted(f"r:e0:i{i}" for i in range(6))
    assert whole[6:] == ["r:e1:i0", "r:e1:i1"]


async def test_resuming_over_a_file_of_another_size_is_refused(tmp_path):
    from dockyard.broker.memory import MemoryPlane

    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 6)
    config = file_run(path)
    async with MemoryPlane() as plane:
        first = dispatcher_over(config, plane)
        await first.top_up(0, 0)
        saved = first.state_dict()
        write_jsonl(path, [{"prompt": "1+1=", "answer": "2"}] * 7)
        with pytest.raises(ValueError, match="dataset of 6 records, and mine/train now has 7"):
            dispatcher_over(config, plane).load_state_dict(saved)
