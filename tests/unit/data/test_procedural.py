"""reasoning-gym tasks as datasets (``reasoning_gym/<task>``) and the ``reasoning_gym``
environment scoring with the task's own verifier."""

from __future__ import annotations

import dataclasses

import pytest
import reasoning_gym

from dockyard.cli import CliError
from dockyard.commands._common import EXIT_INVALID_CONFIG
from dockyard.commands._roles import prepare_trainer
from dockyard.config.loader import load_config
from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError, UnknownDatasetError
from dockyard.data.catalog import build_dataset
from dockyard.environments import (
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)

PARAMS = {"seed": 7, "size": 5, "min_terms": 2, "max_terms": 3}


def arithmetic(split="train", **params):
    config = DatasetConfig(
        name="reasoning_gym/basic_arithmetic", split=split, params={**PARAMS, **params}
    )
    return build_dataset(config, "reasoning_gym")


def test_items_are_reasoning_gyms_own():
    dataset = arithmetic()
    reference = reasoning_gym.create_dataset(
        "basic_arithmetic", seed=7, size=5, min_terms=2, max_terms=3
    )
    assert len(dataset) == 5
    for index in range(5):
        record = dataset[index]
        assert (record.prompt, record.ground_truth) == (
            reference[index]["question"],
            reference[index]["answer"],
        )
        assert record.env == "reasoning_gym"


def test_validation_draws_other_items():
    train = [arithmetic()[i].prompt for i in range(5)]
    validation = [arithmetic("validation")[i].prompt for i in range(5)]
    assert train == [arithmetic()[i].prompt for i in range(5)]  # deterministic
    assert train != validation


def test_unknown_tasks_and_bad_params_are_refused():
    with pytest.raises(UnknownDatasetError, match="did you mean basic_arithmetic"):
        build_dataset(DatasetConfig(name="reasoning_gym/basic_arithmetc"), "math")
    with pytest.raises(DatasetError, match="refused") as refused:
        arithmetic(min_terms=5, max_terms=2)
    assert refused.value.key == "params"


def test_launch_refuses_an_unknown_task_with_its_key_path():
    config = load_config(
        "configs/quickstart.yaml",
        ["data.train.name=reasoning_gym/no_such_task", "~data.train.params"],
    )
    with pytest.raises(
        CliError, match=r"^data\.train\.name: unknown reasoning-gym task"
    ) as refused:
        prepare_trainer(config)
    assert refused.value.exit_code == EXIT_INVALID_CONFIG


def group_for(record, *responses: str) -> ScoringGroup:
    return ScoringGroup(
        group_id="g",
        env_name="reasoning_gym",
        prompt_text=record.prompt,
        samples=[SampleInput(text) for text in responses],
        ground_truth=record.ground_truth,
        extra=dict(record.extra),
    )


async def test_the_tasks_verifier_scores_the_answer_tag():
    record = arithmetic()[0]
    truth = int(record.ground_truth)
    score = await build_environment("reasoning_gym").score(
        group_for(
            record,
            f"thinking... <answer>{truth}</answer>",
            f"<answer>{truth + 1}</answer>",
            f"the answer is {truth}",  # no tag: no answer
            "<answer>)))(((</answer>",  # malformed
        )
    )
    assert score.rewards == [1.0, 0.0, 0.0, 0.0]
    assert ScoreFlag.INVALID_ACTION in score.samples[2].flags
    assert "no <answer>" in score.samples[2].detail


async def test_a_task_with_tuples_in_its_metadata_scores_its_reference_answer():
    # arc_agi's verifier reads tuple-valued metadata: the item must reach it intact.
    config = DatasetConfig(name="reasoning_gym/arc_agi", params={"size": 2, "seed": 3})
    record = build_dataset(config, "reasoning_gym")[0]
    score = await build_environment("reasoning_gym").score(
        group_for(record, f"<answer>{record.ground_truth}</answer>", "<answer>1 2\n3</answer>")
    )
    assert score.rewards[0] == 1.0 and score.rewards[1] < 1.0


async def test_a_group_without_an_item_is_invalid_input():
    record = arithmetic()[0]
    group = group_for(record, "<answer>1</answer>")
    group = dataclasses.replace(group, extra={})
    with pytest.raises(InvalidScoringInput) as refused:
        await build_environment("reasoning_gym").score(group)
    assert refused.value.reason_code == "missing_reasoning_gym_item"
