"""``digit_tasks``: the V4 demo's two domains (addition and digit reversal), each record
carrying its domain's agent name, with held-out problems never in the training split."""

from __future__ import annotations

import pytest

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError
from dockyard.data.catalog import build_dataset


def records(tasks: str, split: str = "train", count: int = 400):
    dataset = build_dataset(
        DatasetConfig(
            name="digit_tasks", split=split, params={"tasks": tasks, "num_samples": count}
        ),
        "arithmetic",
    )
    return [dataset[i] for i in range(len(dataset))]


def test_addition_and_reversal_answers_and_agents():
    for record in records("add", count=50):
        a, b = record.prompt.removesuffix("=").split("+")
        assert record.ground_truth == str(int(a) + int(b)) and record.agent_name == "adder"
    for record in records("reverse", count=50):
        number = record.prompt.removesuffix("=")
        assert record.ground_truth == number[::-1] and record.agent_name == "reverser"
        assert not number.endswith("0")  # its reversal would need a leading zero
        assert 100 <= int(number) <= 999


@pytest.mark.parametrize("tasks", ["add+reverse", "add,reverse"])
def test_the_mixture_interleaves_both_agents(tasks):
    mixed = records(tasks, count=10)
    assert len(mixed) == 10
    assert [r.agent_name for r in mixed] == ["adder", "reverser"] * 5


@pytest.mark.parametrize("task", ["add", "reverse"])
def test_held_out_problems_are_never_trained_on(task):
    train = {r.prompt for r in records(task, count=5000)}
    held_out = {r.prompt for r in records(task, split="validation", count=50)}
    assert len(held_out) == 50 and not train & held_out


def test_an_unknown_task_is_refused_with_its_key():
    with pytest.raises(DatasetError) as error:
        records("add+multiply")
    assert error.value.key == "params.tasks" and "multiply" in str(error.value)
