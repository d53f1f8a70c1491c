"""Hydra override grammar applied to configs (set, add, force-add, delete, values)."""

from __future__ import annotations

import pytest

from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config, load_config_report


def test_plain_set_changes_a_yaml_key(write_config):
    cfg = load_config(
        write_config(), ["grpo.num_prompts_per_step=2", "policy.train_global_batch_size=8"]
    )
    assert cfg.grpo.num_prompts_per_step == 2
    assert cfg.policy.train_global_batch_size == 8


def test_plain_set_works_for_a_key_that_only_has_a_schema_default(write_config):
    # loss_fn.use_cispo is not in the YAML; the reference system needs '+' here, we do not.
    cfg = load_config(write_config(), ["loss_fn.ratio_clip_c=3.0", "policy.optimizer.lr=5e-5"])
    assert cfg.loss_fn.ratio_clip_c == 3.0
    assert cfg.policy.optimizer.lr == 5e-5


def test_plain_set_of_an_unknown_key_is_refused_with_a_suggestion(write_config):
    with pytest.raises(ConfigError) as error:
        load_config(write_config(), ["loss_fn.ratio_clip_mn=0.1"])
    message = str(error.value)
    assert "loss_fn.ratio_clip_mn" in message
    assert "+loss_fn.ratio_clip_mn" in message
    assert "did you mean 'loss_fn.ratio_clip_min'" in message


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("polcy.model_name=x", "policy.model_name"),  # a misspelt section
        ("policy.generaton.temperature=1", "policy.generation.temperature"),  # a nested one
    ],
)
def test_a_misspelt_section_gets_a_suggestion_too(write_config, override, suggestion):
    with pytest.raises(ConfigError) as error:
        load_config(write_config(), [override])
    assert f"did you mean {suggestion!r}" in str(error.value)


def test_add_creates_a_new_key_and_refuses_an_existing_one(write_config):
    report = load_config_report(write_config(), ["+my_extension.flag=true"])
    assert report.config.model_extra["my_extension"] == {"flag": True}
    with pytest.raises(ConfigError, match="already set"):
        load_config(write_config(), ["+grpo.num_prompts_per_step=4"])


def test_force_add_sets_existing_and_new_keys(write_config):
    cfg = load_config(write_config(), ["++grpo.seed=7", "++tracking.tag=abc"])
    assert cfg.grpo.seed == 7
    assert cfg.model_extra["tracking"] == {"tag": "abc"}


def test_delete_removes_a_key_so_the_schema_default_applies(write_config, minimal_config):
    minimal_config["grpo"]["seed"] = 99
    path = write_config(minimal_config)
    assert load_config(path).grpo.seed == 99
    assert load_config(path, ["~grpo.seed"]).grpo.seed == 42


def test_delete_with_value_only_deletes_a_matching_value(write_config):
    path = write_config()
    assert load_config(path, ["~grpo.num_prompts_per_step=4", "grpo.num_prompts_per_step=4"])
    with pytest.raises(ConfigError, match="not 5"):
        load_config(path, ["~grpo.num_prompts_per_step=5"])


def test_delete_of_a_missing_key_is_an_error(write_config):
    with pytest.raises(ConfigError, match="cannot delete"):
        load_config(write_config(), ["~grpo.no_such_key"])


def test_values_lists_dicts_quoted_strings_and_null(write_config):
    cfg = load_config(
        write_config(),
        [
            "policy.generation.stop_token_ids=[1,2,3]",
            "policy.generation.vllm_cfg.env_vars={VLLM_USE_V1: '1', MOE_BACKEND: triton}",
            "policy.tokenizer.name='a name with spaces'",
            "loss_fn.kl_input_clamp_value=null",
        ],
    )
    assert cfg.policy.generation.stop_token_ids == [1, 2, 3]
    assert cfg.policy.generation.vllm_cfg.env_vars == {"VLLM_USE_V1": "1", "MOE_BACKEND": "triton"}
    assert cfg.policy.tokenizer.name == "a name with spaces"
    assert cfg.loss_fn.kl_input_clamp_value is None


def test_interpolations_in_override_values_are_resolved(write_config):
    cfg = load_config(
        write_config(),
        [
            "policy.generation_batch_size=${policy.train_global_batch_size}",
            # Hydra's grammar does not nest interpolations unquoted: quote the value.
            "policy.logprob_batch_size='${mul:${policy.train_micro_batch_size},2}'",
        ],
    )
    assert cfg.policy.generation_batch_size == 16
    assert cfg.policy.logprob_batch_size == 8


def test_an_unparsable_override_is_reported_with_its_key_path(write_config):
    with pytest.raises(ConfigError, match="cannot parse override") as error:
        load_config(write_config(), ["++policy.generation.stop_token_ids=[1,"])
    assert [issue.path for issue in error.value.issues] == ["policy.generation.stop_token_ids"]


def test_every_bad_override_is_reported_together(write_config):
    with pytest.raises(ConfigError) as error:
        load_config(write_config(), ["grpo.nope=1", "loss_fn.nope=2"])
    assert len(error.value.issues) == 2
