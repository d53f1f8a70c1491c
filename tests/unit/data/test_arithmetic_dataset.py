"""The quickstart dataset: deterministic, and held-out problems never appear in training."""

from __future__ import annotations

import pytest

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.catalog import build_dataset, dataset_names


def build(split: str, **params: int):
    return build_dataset(DatasetConfig(name="arithmetic", split=split, params=params), "arithmetic")


def test_records_are_well_formed():
    record = build("train", num_samples=5, seed=3)[2]
    a, b = (int(x) for x in record.prompt.rstrip("=").split("+"))
    assert record.prompt == f"{a}+{b}="
    assert record.ground_truth == str(a + b)
    assert 10 <= a <= 99 and 10 <= b <= 99
    assert record.env == "arithmetic"


def test_same_seed_same_data_and_different_seed_different_data():
    assert (
        build("train", num_samples=50, seed=1).pairs == build("train", num_samples=50, seed=1).pairs
    )
    assert (
        build("train", num_samples=50, seed=1).pairs != build("train", num_samples=50, seed=2).pairs
    )


def test_validation_is_held_out_from_training():
    train = set(build("train", num_samples=20_000, seed=1).pairs)
    validation = build("validation", num_samples=200, seed=2).pairs
    assert len(set(validation)) == 200  # distinct evaluation problems
    assert not train & set(validation)


def test_unknown_dataset_names_the_registered_ones():
    assert "arithmetic" in dataset_names()
    with pytest.raises(KeyError, match="arithmetic"):
        build_dataset(DatasetConfig(name="nope"), "math")


def test_the_multiplication_variant_asks_for_the_product():
    config = DatasetConfig(
        name="arithmetic", split="train", params={"op": "*", "num_samples": 5, "seed": 3}
    )
    record = build_dataset(config, "arithmetic")[2]
    a, b = (int(x) for x in record.prompt.rstrip("=").split("*"))
    assert record.prompt == f"{a}*{b}=" and record.ground_truth == str(a * b)


def test_an_unknown_operator_is_refused():
    from dockyard.data.base import DatasetError

    config = DatasetConfig(name="arithmetic", split="train", params={"op": "-"})
    with pytest.raises(DatasetError, match="op must be one of"):
        build_dataset(config, "arithmetic")


def test_a_misspelt_parameter_is_refused_with_its_key_and_the_near_name():
    # A generator's params name only what it reads: "num_sample" would leave 10,000 in place.
    from dockyard.data.base import DatasetError

    config = DatasetConfig(name="arithmetic", split="train", params={"num_sample": 5})
    with pytest.raises(DatasetError, match="did you mean 'num_samples'") as caught:
        build_dataset(config, "arithmetic")
    assert caught.value.key == "params.num_sample"


def test_a_record_demonstrates_the_calculator_call_that_answers_it():
    # docs/multiturn.md: the call's expression is the prompt without "=", its result the answer.
    config = DatasetConfig(
        name="arithmetic",
        split="train",
        params={"op": "*", "num_samples": 3, "seed": 3, "demonstrate_tool": "calculator"},
    )
    record = build_dataset(config, "arithmetic")[1]
    a, b = (int(x) for x in record.prompt.rstrip("=").split("*"))
    call = {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}, "result": str(a * b)}
    assert record.extra == {"demonstration": {"tool_calls": [call]}}


def test_only_a_known_toolbox_is_demonstrated():
    from dockyard.data.base import DatasetError

    config = DatasetConfig(name="arithmetic", params={"demonstrate_tool": "abacus"})
    with pytest.raises(DatasetError, match="calculator"):
        build_dataset(config, "arithmetic")
