"""A vision-language policy with a setting that cannot carry its samples' images is refused at
launch, with the key path and why; a text policy is not affected."""

from __future__ import annotations

import argparse

import pytest

from dockyard.commands._cli import CliError
from dockyard.commands._common import load_role_config
from dockyard.config.loader import load_config
from dockyard.models.vision_support import vision_issues

VLM = "policy.model_name=tiny://qwen2-vl-bpe"


def paths(*overrides: str) -> list[str]:
    return [
        issue.path
        for issue in vision_issues(load_config("configs/quickstart.yaml", list(overrides)))
    ]


def test_a_vlm_on_the_torch_engine_and_trainer_runs():
    assert paths(VLM) == []
    assert paths(VLM, "policy.dynamic_batching.enabled=true") == []


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ("policy.sequence_packing.enabled=true", "policy.sequence_packing.enabled"),
        ("policy.generation.backend=vllm", "policy.generation.backend"),
        ("policy.dtensor_cfg.context_parallel_size=2", "policy.dtensor_cfg.context_parallel_size"),
        ("policy.dtensor_cfg.tensor_parallel_size=2", "policy.dtensor_cfg.tensor_parallel_size"),
    ],
)
def test_combinations_that_cannot_carry_images_are_refused_by_key(override, path):
    assert paths(VLM, override) == [path]
    # The same setting with a text model is not this check's business.
    assert paths(override) == []


def test_the_jax_trainer_is_refused_for_a_vlm():
    found = paths(VLM, "policy.dtensor_cfg.enabled=false", "policy.jax_cfg.enabled=true")
    assert found == ["policy.jax_cfg.enabled"]


def test_a_role_refuses_to_start_with_exit_2_naming_the_key():
    args = argparse.Namespace(
        config="configs/quickstart.yaml",
        overrides=[VLM, "policy.sequence_packing.enabled=true"],
    )
    with pytest.raises(CliError) as caught:
        load_role_config(args)
    assert caught.value.exit_code == 2
    assert "policy.sequence_packing.enabled: policy.model_name=tiny://qwen2-vl-bpe is a " in str(
        caught.value
    )
