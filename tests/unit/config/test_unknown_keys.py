"""Unknown keys inside typed sections are warned about with a suggestion; top-level extras are
allowed (the spec's ``extra="allow"``), silently unless they are a near miss of a section."""

from __future__ import annotations

from dockyard.config.loader import load_config_report


def test_misspelt_key_in_a_section_warns_with_a_suggestion(write_config, minimal_config):
    minimal_config["loss_fn"]["ratio_clip_mx"] = 0.3
    minimal_config["policy"]["generation"]["temprature"] = 0.5
    report = load_config_report(write_config(minimal_config))
    by_path = {warning.path: warning for warning in report.warnings}
    assert by_path["loss_fn.ratio_clip_mx"].suggestion == "loss_fn.ratio_clip_max"
    assert by_path["policy.generation.temprature"].suggestion == "policy.generation.temperature"
    assert "did you mean 'policy.generation.temperature'?" in str(
        by_path["policy.generation.temprature"]
    )
    # The misspelt value is not silently applied to the real field.
    assert report.config.policy.generation.temperature == 1.0


def test_unknown_key_without_a_close_match_has_no_suggestion(write_config, minimal_config):
    minimal_config["grpo"]["zzzzzz"] = 1
    (warning,) = load_config_report(write_config(minimal_config)).warnings
    assert warning.path == "grpo.zzzzzz"
    assert warning.suggestion is None


def test_top_level_extras_are_silent_and_kept(write_config, minimal_config):
    minimal_config["my_subsystem"] = {"anything": [1, 2]}
    report = load_config_report(write_config(minimal_config))
    assert report.warnings == []
    assert report.config.model_extra["my_subsystem"] == {"anything": [1, 2]}


def test_a_near_miss_of_a_section_warns_like_a_typo_inside_one(write_config, minimal_config):
    minimal_config["grpoo"] = {"max_num_steps": 2}
    minimal_config["polcy"] = {"precision": "bfloat16"}
    report = load_config_report(write_config(minimal_config))
    by_path = {warning.path: warning for warning in report.warnings}
    assert set(by_path) == {"grpoo", "polcy"}
    assert by_path["grpoo"].suggestion == "grpo"
    assert "unknown key 'grpoo'" in str(by_path["grpoo"])
    assert "did you mean 'grpo'?" in str(by_path["grpoo"])
    assert by_path["polcy"].suggestion == "policy"
    # Still an extra section, kept as the spec allows; the real one is not touched.
    assert report.config.model_extra["grpoo"] == {"max_num_steps": 2}


def test_an_extra_section_that_only_resembles_one_stays_silent(write_config, minimal_config):
    # Real extra sections (configs/cpu/data/swe_policy.yaml's ``repos``, the recipe's ``stages``)
    # share letters with a section's name without being a misspelling of it.
    for extra in ("repos", "stages", "recipe", "policies", "grpo_cfg"):
        minimal_config[extra] = {"x": 1}
    assert load_config_report(write_config(minimal_config)).warnings == []


def test_free_form_maps_do_not_warn(write_config, minimal_config):
    minimal_config["policy"]["generation"]["vllm_cfg"] = {"env_vars": {"ANY_NAME": "1"}}
    minimal_config["data"]["train"]["params"] = {"low": 1, "custom": "x"}
    assert load_config_report(write_config(minimal_config)).warnings == []


def test_typed_maps_of_sections_are_checked(write_config, minimal_config):
    minimal_config["on_policy_distillation"] = {
        "teachers": {"expert": {"model_name": "/m", "precison": "bfloat16"}}
    }
    (warning,) = load_config_report(write_config(minimal_config)).warnings
    assert warning.path == "on_policy_distillation.teachers.expert.precison"
    assert warning.suggestion == "on_policy_distillation.teachers.expert.precision"
