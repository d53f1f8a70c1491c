"""Every launch-time rule: a valid case passes, an invalid one names its key path."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from dockyard.algorithms.grpo import registered_names
from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config
from dockyard.config.master import RegisteredNames
from dockyard.config.sections.loss import ClippedPGLossConfig
from dockyard.config.sections.policy import GenerationConfig, sampling_parameter_issues

ASYNC_OK = [
    "grpo.async_grpo.enabled=true",
    "loss_fn.use_importance_sampling_correction=true",
]
OPD_OK = [
    *ASYNC_OK,
    "grpo.adv_estimator.name=opd",
    "on_policy_distillation.enabled=true",
    "on_policy_distillation.default_teacher_alias=math_expert",
    "+on_policy_distillation.teachers.math_expert.model_name=/models/math",
]

#: GSPO with the sequence-level loss it needs.
GSPO = ["loss_fn.sequence_level_importance_ratios=true", "loss_fn.token_level_loss=false"]

#: π_old := sg(π_θ): no π_old pass (the step is one optimizer update on its batch).
ON_POLICY_NO_PREV = ["policy.skip_prev_logprobs=true", "loss_fn.force_on_policy_ratio=true"]

INVALID_CASES: list[tuple[str, list[str], str]] = [
    ("batch shape", ["grpo.num_prompts_per_step=3"], "policy.train_global_batch_size"),
    (
        "async + dynamic sampling",
        [*ASYNC_OK, "grpo.use_dynamic_sampling=true"],
        "grpo.use_dynamic_sampling",
    ),
    (
        "async + reward scaling",
        [*ASYNC_OK, "grpo.reward_scaling.enabled=true"],
        "grpo.reward_scaling.enabled",
    ),
    (
        "async + reward shaping",
        [*ASYNC_OK, "grpo.reward_shaping.enabled=true"],
        "grpo.reward_shaping.enabled",
    ),
    (
        "async + multiple dataloaders",
        [*ASYNC_OK, "data.extra_train_dataloaders=[{name: gsm8k}]"],
        "data.extra_train_dataloaders",
    ),
    (
        "async without IS",
        ["grpo.async_grpo.enabled=true"],
        "loss_fn.use_importance_sampling_correction",
    ),
    ("opd without async", [*OPD_OK, "grpo.async_grpo.enabled=false"], "grpo.async_grpo.enabled"),
    (
        "opd zeroing prev_logprobs",
        [*OPD_OK, "policy.skip_prev_logprobs=true"],
        "policy.skip_prev_logprobs",
    ),
    (
        "opd without distillation section",
        [*OPD_OK, "on_policy_distillation.enabled=false"],
        "on_policy_distillation.enabled",
    ),
    (
        "opd teacher unknown",
        [*OPD_OK, "on_policy_distillation.teacher_model_by_agent_name={a: nope}"],
        "on_policy_distillation.teacher_model_by_agent_name.a",
    ),
    (
        "served teacher with a precision it cannot apply",
        [
            *OPD_OK,
            "+on_policy_distillation.teachers.math_expert.base_url=http://127.0.0.1:8000",
            "+on_policy_distillation.teachers.math_expert.precision=float32",
        ],
        "on_policy_distillation.teachers.math_expert.precision",
    ),
    (
        "served teacher without an http URL",
        [*OPD_OK, "+on_policy_distillation.teachers.math_expert.base_url=127.0.0.1:8000"],
        "on_policy_distillation.teachers.math_expert.base_url",
    ),
    (
        # The REINFORCE form keeps prev as given: the IS weight would be exp(0 − gen).
        "skip prev with IS, no on-policy ratio",
        [
            "policy.skip_prev_logprobs=true",
            "loss_fn.disable_ppo_ratio=true",
            "loss_fn.use_importance_sampling_correction=true",
        ],
        "policy.skip_prev_logprobs",
    ),
    (
        "skip prev with the log-prob error filter",
        [*ON_POLICY_NO_PREV, "grpo.seq_logprob_error_threshold=2"],
        "policy.skip_prev_logprobs",
    ),
    (
        "skip prev with KL in the reward",
        [*ON_POLICY_NO_PREV, "loss_fn.use_kl_in_reward=true"],
        "policy.skip_prev_logprobs",
    ),
    ("skip prev with PPO ratio", ["policy.skip_prev_logprobs=true"], "policy.skip_prev_logprobs"),
    ("unknown estimator", ["grpo.adv_estimator.name=magic"], "grpo.adv_estimator.name"),
    # GSPO's one ratio per sequence averages per-token advantages over the sequence.
    (
        "gspo with the opd estimator's per-token advantages",
        [*OPD_OK, *GSPO],
        "loss_fn.sequence_level_importance_ratios",
    ),
    (
        "gspo with KL folded into the advantages",
        [*GSPO, "loss_fn.use_kl_in_reward=true"],
        "loss_fn.sequence_level_importance_ratios",
    ),
    (
        "gspo with REINFORCE++'s KL return to go",
        [*GSPO, "grpo.adv_estimator.name=reinforce_plus_plus", "loss_fn.use_kl_in_reward=true"],
        "loss_fn.sequence_level_importance_ratios",
    ),
    ("temperature nan", ["policy.generation.temperature=nan"], "policy.generation.temperature"),
    ("temperature inf", ["policy.generation.temperature=inf"], "policy.generation.temperature"),
    ("temperature negative", ["policy.generation.temperature=-1"], "policy.generation.temperature"),
    ("top_p nan", ["policy.generation.top_p=nan"], "policy.generation.top_p"),
    ("top_p zero", ["policy.generation.top_p=0"], "policy.generation.top_p"),
    ("top_p above one", ["policy.generation.top_p=1.5"], "policy.generation.top_p"),
    ("top_k zero", ["policy.generation.top_k=0"], "policy.generation.top_k"),
    (
        "gspo with token loss",
        ["loss_fn.sequence_level_importance_ratios=true"],
        "loss_fn.sequence_level_importance_ratios",
    ),
    (
        "cispo with sequence loss",
        ["loss_fn.use_cispo=true", "loss_fn.token_level_loss=false"],
        "loss_fn.use_cispo",
    ),
    (
        "cispo without ratio",
        ["loss_fn.use_cispo=true", "loss_fn.disable_ppo_ratio=true"],
        "loss_fn.use_cispo",
    ),
    (
        "reinforce with gspo",
        [
            "loss_fn.disable_ppo_ratio=true",
            "loss_fn.token_level_loss=false",
            "loss_fn.sequence_level_importance_ratios=true",
        ],
        "loss_fn.disable_ppo_ratio",
    ),
    (
        "force on-policy with reinforce",
        ["loss_fn.disable_ppo_ratio=true", "loss_fn.force_on_policy_ratio=true"],
        "loss_fn.force_on_policy_ratio",
    ),
    ("dual clip c <= 1", ["loss_fn.ratio_clip_c=1.0"], "loss_fn.ratio_clip_c"),
    (
        "truncated IS without IS",
        [
            "loss_fn.truncated_importance_sampling_type=tis",
            "loss_fn.truncated_importance_sampling_ratio=2.0",
        ],
        "loss_fn.truncated_importance_sampling_type",
    ),
    (
        "tis without bound",
        [
            "loss_fn.use_importance_sampling_correction=true",
            "loss_fn.truncated_importance_sampling_type=tis",
        ],
        "loss_fn.truncated_importance_sampling_ratio",
    ),
    (
        "icepop without lower bound",
        [
            "loss_fn.use_importance_sampling_correction=true",
            "loss_fn.truncated_importance_sampling_type=icepop",
            "loss_fn.truncated_importance_sampling_ratio=5",
        ],
        "loss_fn.truncated_importance_sampling_ratio_min",
    ),
    (
        "IS bounds inverted",
        [
            "loss_fn.use_importance_sampling_correction=true",
            "loss_fn.truncated_importance_sampling_type=seq-mask-tis",
            "loss_fn.truncated_importance_sampling_ratio=0.9",
            "loss_fn.truncated_importance_sampling_ratio_min=1.1",
        ],
        "loss_fn.truncated_importance_sampling_ratio_min",
    ),
    ("negative clip", ["loss_fn.ratio_clip_min=-0.1"], "loss_fn.ratio_clip_min"),
    (
        "unknown kl type",
        ["loss_fn.reference_policy_kl_type=k4"],
        "loss_fn.reference_policy_kl_type",
    ),
    ("two trainer backends", ["policy.megatron_cfg.enabled=true"], "policy.megatron_cfg.enabled"),
    (
        "packing and dynamic batching",
        ["policy.sequence_packing.enabled=true", "policy.dynamic_batching.enabled=true"],
        "policy.sequence_packing.enabled",
    ),
    (
        "micro batch does not divide",
        ["policy.train_micro_batch_size=3"],
        "policy.train_micro_batch_size",
    ),
    (
        "generation longer than budget",
        ["policy.generation.max_new_tokens=65"],
        "policy.generation.max_new_tokens",
    ),
    (
        "prompt plus generation over budget",
        ["data.max_input_seq_length=60"],
        "policy.max_total_sequence_length",
    ),
    (
        "tp does not divide gpus",
        ["cluster.gpus_per_node=6", "policy.dtensor_cfg.tensor_parallel_size=4"],
        "policy.dtensor_cfg.tensor_parallel_size",
    ),
    (
        "fp8 without vllm",
        ["policy.generation.vllm_cfg.precision=fp8"],
        "policy.generation.vllm_cfg.precision",
    ),
    (
        "vllm server without urls",
        ["policy.generation.vllm_cfg.mode=server"],
        "policy.generation.vllm_cfg.server_urls",
    ),
    ("bad backend name", ["policy.generation.backend=tensorrt"], "policy.generation.backend"),
    (
        "reward scaling range",
        ["grpo.reward_scaling.source_min=2"],
        "grpo.reward_scaling.source_max",
    ),
    (
        "advantage clip inverted",
        ["grpo.advantage_clip_low=1", "grpo.advantage_clip_high=-1"],
        "grpo.advantage_clip_low",
    ),
    (
        "overlong buffer without length",
        ["grpo.reward_shaping.enabled=true", "grpo.reward_shaping.overlong_buffer_length=16"],
        "grpo.reward_shaping.max_response_length",
    ),
    (
        "kv recompute without in-flight",
        ["grpo.async_grpo.recompute_kv_cache_after_weight_updates=true"],
        "grpo.async_grpo.recompute_kv_cache_after_weight_updates",
    ),
    (
        "max age zero",
        ["grpo.async_grpo.max_trajectory_age_steps=0"],
        "grpo.async_grpo.max_trajectory_age_steps",
    ),
    ("data plane url", ["+data_plane.url=http://example"], "data_plane.url"),
    ("payload over pending", ["+data_plane.max_payload=100000000"], "data_plane.max_payload"),
    (
        "user without password",
        ["+data_plane.credentials.user=alice"],
        "data_plane.credentials.password",
    ),
    ("cert without key", ["+data_plane.tls.cert_file=/c.pem"], "data_plane.tls.key_file"),
    (
        "filesystem weights without path",
        ["+data_plane.weight_transport.kind=filesystem"],
        "data_plane.weight_transport.path",
    ),
    (
        "sglang without servers",
        ["policy.generation.backend=sglang"],
        "policy.generation.sglang_cfg.server_urls",
    ),
    (
        "opd teacher alias without teachers",
        [*OPD_OK[:-1]],  # the alias names a teacher that no `teachers` entry defines
        "on_policy_distillation.default_teacher_alias",
    ),
    ("missing section", ["~cluster"], "cluster"),
    ("missing model name", ["~policy.model_name"], "policy.model_name"),
    ("wrong type", ["grpo.num_prompts_per_step=many"], "grpo.num_prompts_per_step"),
    ("code task timeout", ["env.code.task_timeout=0"], "env.code.task_timeout"),
]


@pytest.mark.parametrize(
    ("overrides", "key"), [(o, k) for _, o, k in INVALID_CASES], ids=[c[0] for c in INVALID_CASES]
)
def test_invalid_config_names_the_key_path(write_config, overrides, key):
    with pytest.raises(ConfigError) as error:
        # As the launch path loads it: with the names the algorithms package registers.
        load_config(write_config(), overrides, registered=registered_names())
    paths = [issue.path for issue in error.value.issues]
    assert key in paths, f"expected an issue at {key!r}, got {error.value}"


VALID_CASES: list[tuple[str, list[str]]] = [
    ("minimal", []),
    ("async with IS", ASYNC_OK),
    ("opd", OPD_OK),
    (
        "opd with a served teacher",
        [*OPD_OK, "+on_policy_distillation.teachers.math_expert.base_url=http://10.0.0.2:8000"],
    ),
    (
        "sync with dynamic sampling, scaling and shaping",
        [
            "grpo.use_dynamic_sampling=true",
            "grpo.reward_scaling.enabled=true",
            "grpo.reward_shaping.enabled=true",
            "grpo.reward_shaping.overlong_buffer_length=4",
            "grpo.reward_shaping.max_response_length=16",
        ],
    ),
    ("gspo with sequence loss", GSPO),
    # Per-sample advantages, constant over each sequence: GSPO takes them whole.
    (
        "gspo with reinforce++ without KL in the reward",
        [*GSPO, "grpo.adv_estimator.name=reinforce_plus_plus"],
    ),
    ("gspo with gdpo", [*GSPO, "grpo.adv_estimator.name=gdpo"]),
    ("cispo", ["loss_fn.use_cispo=true"]),
    (
        "icepop",
        [
            "loss_fn.use_importance_sampling_correction=true",
            "loss_fn.truncated_importance_sampling_type=icepop",
            "loss_fn.truncated_importance_sampling_ratio=5",
            "loss_fn.truncated_importance_sampling_ratio_min=0.5",
        ],
    ),
    ("on-policy without prev", ON_POLICY_NO_PREV),
    # The loss forms the IS weight from sg(π_θ), never from the zeros (the quickstart).
    ("on-policy without prev, with IS", [*ON_POLICY_NO_PREV, *ASYNC_OK]),
    ("greedy", ["policy.generation.temperature=0", "policy.generation.top_k=-1"]),
    ("fp8 on vllm", ["policy.generation.backend=vllm", "policy.generation.vllm_cfg.precision=fp8"]),
    ("megatron alone", ["policy.dtensor_cfg.enabled=false", "policy.megatron_cfg.enabled=true"]),
    ("tp divides gpus", ["cluster.gpus_per_node=8", "policy.dtensor_cfg.tensor_parallel_size=4"]),
    (
        "data plane",
        [
            "+data_plane.url=nats://10.0.0.1:4222",
            "+data_plane.credentials.user=a",
            "+data_plane.credentials.password=b",
        ],
    ),
    ("null data plane", ["+data_plane=null"]),
]


@pytest.mark.parametrize("overrides", [o for _, o in VALID_CASES], ids=[c[0] for c in VALID_CASES])
def test_valid_config_passes(write_config, overrides):
    load_config(write_config(), overrides)


def test_all_problems_are_reported_together(write_config):
    with pytest.raises(ConfigError) as error:
        load_config(
            write_config(),
            [
                "policy.generation.temperature=nan",
                "policy.generation.top_p=2",
                "loss_fn.use_cispo=true",
                "loss_fn.token_level_loss=false",
                "grpo.advantage_clip_low=1",
                "grpo.advantage_clip_high=0",
            ],
        )
    paths = {issue.path for issue in error.value.issues}
    assert {
        "policy.generation.temperature",
        "policy.generation.top_p",
        "loss_fn.use_cispo",
        "grpo.advantage_clip_low",
    } <= paths
    assert "4 problems" in str(error.value)


def test_section_rules_run_when_a_section_is_built_in_code():
    with pytest.raises(ValidationError, match=r"loss_fn\.token_level_loss"):
        ClippedPGLossConfig(use_cispo=True, token_level_loss=False)
    with pytest.raises(ValidationError, match="finite"):
        GenerationConfig(temperature=math.nan)


def test_worker_side_sampling_check_is_the_same_function():
    paths = [issue.path for issue in sampling_parameter_issues(math.inf, 0.0, 0)]
    assert paths == ["temperature", "top_p", "top_k"]
    assert sampling_parameter_issues(0.7, 0.95, 50) == []


def test_the_estimator_name_is_checked_against_the_registry_the_caller_passes(write_config):
    # config/ imports no other dockyard package: the names come from the caller, so a registry
    # without reinforce_plus_plus refuses it, naming the key and the names that are registered.
    only_two = RegisteredNames(advantage_estimators=("grpo", "opd"))
    with pytest.raises(ConfigError) as error:
        load_config(
            write_config(), ["grpo.adv_estimator.name=reinforce_plus_plus"], registered=only_two
        )
    assert [str(issue) for issue in error.value.issues] == [
        "grpo.adv_estimator.name: unknown estimator 'reinforce_plus_plus'; choose one of grpo, opd"
    ]
    # Each registered name loads.
    for name in ("grpo", "opd"):
        overrides = OPD_OK if name == "opd" else []
        load_config(write_config(), overrides, registered=only_two)


def test_an_unregistered_estimator_is_reported_with_problems_in_other_sections(write_config):
    with pytest.raises(ConfigError) as error:
        load_config(
            write_config(),
            ["grpo.adv_estimator.name=magic", "policy.generation.temperature=nan"],
            registered=registered_names(),
        )
    paths = {issue.path for issue in error.value.issues}
    assert {"grpo.adv_estimator.name", "policy.generation.temperature"} <= paths
