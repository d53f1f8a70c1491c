"""YAML inheritance through ``defaults:`` and the custom OmegaConf resolvers."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config, load_yaml_tree
from dockyard.config.resolvers import register_omegaconf_resolvers


def test_child_wins_over_parent_and_parents_merge_in_order(tmp_path, minimal_config):
    (tmp_path / "base").mkdir()
    minimal_config["grpo"]["seed"] = 1
    minimal_config["policy"]["generation"]["stop_token_ids"] = [1, 2, 3]
    (tmp_path / "base" / "core.yaml").write_text(yaml.safe_dump(minimal_config))
    (tmp_path / "base" / "extra.yaml").write_text(
        yaml.safe_dump({"grpo": {"seed": 2, "val_period": 5}})
    )
    child = tmp_path / "child.yaml"
    child.write_text(
        yaml.safe_dump(
            {
                "defaults": ["base/core.yaml", "base/extra.yaml"],
                "grpo": {"val_period": 7},
                "policy": {"generation": {"stop_token_ids": [9]}},
            }
        )
    )
    cfg = load_config(child)
    assert cfg.grpo.seed == 2  # the later parent wins over the earlier one
    assert cfg.grpo.val_period == 7  # the child wins over both
    assert cfg.policy.generation.stop_token_ids == [9]  # lists are replaced, not concatenated
    assert cfg.policy.model_name == "tiny://qwen2-arithmetic"  # untouched parent keys survive
    assert "defaults" not in load_yaml_tree(child)


def test_parents_resolve_relative_to_the_file_that_names_them(tmp_path, minimal_config):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "root.yaml").write_text(yaml.safe_dump(minimal_config))
    (tmp_path / "a" / "mid.yaml").write_text("defaults: b/root.yaml\ngrpo: {seed: 5}\n")
    (tmp_path / "leaf.yaml").write_text("defaults: [a/mid.yaml]\n")
    assert load_config(tmp_path / "leaf.yaml").grpo.seed == 5


def test_inheritance_cycles_and_missing_parents_are_errors(tmp_path):
    (tmp_path / "x.yaml").write_text("defaults: [y.yaml]\n")
    (tmp_path / "y.yaml").write_text("defaults: [x.yaml]\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "x.yaml")
    (tmp_path / "z.yaml").write_text("defaults: [missing.yaml]\n")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "z.yaml")


def test_resolvers_compute_derived_values(write_config, minimal_config):
    minimal_config["policy"]["sequence_packing"] = {
        "enabled": True,
        "train_mb_tokens": (
            "${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}"
        ),
        "logprob_mb_tokens": "${add:${policy.max_total_sequence_length}, 1, 2}",
    }
    minimal_config["policy"]["dynamic_batching"] = {
        "sequence_length_round": "${div:${policy.max_total_sequence_length}, 2}",
    }
    minimal_config["grpo"]["val_batch_size"] = "${max:3, ${grpo.num_prompts_per_step}, 1}"
    minimal_config["grpo"]["max_val_samples"] = "${min:100, ${policy.max_total_sequence_length}}"
    cfg = load_config(write_config(minimal_config))
    assert cfg.policy.sequence_packing.train_mb_tokens == 64 * 4
    assert cfg.policy.sequence_packing.logprob_mb_tokens == 64 + 1 + 2
    assert cfg.policy.dynamic_batching.sequence_length_round == 32
    assert isinstance(cfg.policy.dynamic_batching.sequence_length_round, int)
    assert cfg.grpo.val_batch_size == 4
    assert cfg.grpo.max_val_samples == 64


def test_register_resolvers_is_idempotent():
    register_omegaconf_resolvers()
    register_omegaconf_resolvers()
    node = OmegaConf.create({"a": 6, "b": "${mul:${a},7}", "c": "${div:7,2}"})
    assert node.b == 42
    assert node.c == 3.5


def test_a_failed_interpolation_names_the_key(write_config, minimal_config):
    minimal_config["grpo"]["seed"] = "${policy.no_such_key}"
    with pytest.raises(ConfigError) as error:
        load_config(write_config(minimal_config))
    assert "cannot resolve" in str(error.value)
    assert "grpo.seed" in str(error.value)


def test_a_yaml_syntax_error_is_a_config_error(write_config):
    with pytest.raises(ConfigError, match="YAML syntax error"):
        load_config(write_config("policy: [unclosed\n"))
