"""Invalid option combinations of loss_fn / grpo raise at construction *and* at launch, with the
key path; launch validation runs the very same rule_issues()."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dockyard.config.errors import ConfigError
from dockyard.config.loader import validate_container
from dockyard.config.sections.grpo import RewardShapingConfig
from dockyard.config.sections.loss import ClippedPGLossConfig

IS = {"use_importance_sampling_correction": True}

LOSS_CASES: list[tuple[str, dict[str, object], str]] = [
    ("cispo with sequence loss", {"use_cispo": True, "token_level_loss": False}, "use_cispo"),
    ("cispo without ratio", {"use_cispo": True, "disable_ppo_ratio": True}, "use_cispo"),
    (
        "gspo with token loss",
        {"sequence_level_importance_ratios": True},
        "sequence_level_importance_ratios",
    ),
    (
        "reinforce with gspo",
        {
            "disable_ppo_ratio": True,
            "token_level_loss": False,
            "sequence_level_importance_ratios": True,
        },
        "disable_ppo_ratio",
    ),
    (
        "gspo with KL folded into the advantages",
        {
            "sequence_level_importance_ratios": True,
            "token_level_loss": False,
            "use_kl_in_reward": True,
        },
        "sequence_level_importance_ratios",
    ),
    (
        "force with reinforce",
        {"disable_ppo_ratio": True, "force_on_policy_ratio": True},
        "force_on_policy_ratio",
    ),
    ("dual clip c <= 1", {"ratio_clip_c": 0.9}, "ratio_clip_c"),
    ("dual clip with reinforce", {"ratio_clip_c": 3.0, "disable_ppo_ratio": True}, "ratio_clip_c"),
    ("dual clip with cispo", {"ratio_clip_c": 3.0, "use_cispo": True}, "ratio_clip_c"),
    (
        "kl in reward without penalty",
        {"use_kl_in_reward": True, "reference_policy_kl_penalty": 0.0},
        "use_kl_in_reward",
    ),
    (
        "on-policy KL with KL in reward",
        {"use_kl_in_reward": True, "use_on_policy_kl_approximation": True},
        "use_on_policy_kl_approximation",
    ),
    (
        "truncation without IS",
        {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0},
        "truncated_importance_sampling_type",
    ),
    (
        "bounds without type",
        {**IS, "truncated_importance_sampling_ratio": 2.0},
        "truncated_importance_sampling_type",
    ),
    (
        "tis without upper bound",
        {**IS, "truncated_importance_sampling_type": "tis"},
        "truncated_importance_sampling_ratio",
    ),
    (
        "icepop without lower bound",
        {
            **IS,
            "truncated_importance_sampling_type": "icepop",
            "truncated_importance_sampling_ratio": 5.0,
        },
        "truncated_importance_sampling_ratio_min",
    ),
    (
        "seq-mask-tis with sequence weights",
        {
            **IS,
            "token_level_loss": False,
            "sequence_level_importance_ratios": True,
            "truncated_importance_sampling_type": "seq-mask-tis",
            "truncated_importance_sampling_ratio": 1.002,
            "truncated_importance_sampling_ratio_min": 0.999,
        },
        "truncated_importance_sampling_type",
    ),
    ("infinite kl clamp", {"kl_output_clamp_value": float("inf")}, "kl_output_clamp_value"),
]


@pytest.mark.parametrize(
    ("settings", "key"), [(s, k) for _, s, k in LOSS_CASES], ids=[c[0] for c in LOSS_CASES]
)
def test_invalid_loss_combination_raises_at_construction(settings, key):
    with pytest.raises(ValidationError) as error:
        ClippedPGLossConfig(**settings)
    paths = [
        issue.path
        for detail in error.value.errors()
        for issue in detail.get("ctx", {}).get("issues", [])
    ]
    assert key in paths, str(error.value)


MINIMAL: dict[str, object] = {
    "policy": {
        "model_name": "tiny://qwen2-arithmetic",
        "train_global_batch_size": 16,
        "train_micro_batch_size": 4,
        "max_total_sequence_length": 64,
        "generation": {"max_new_tokens": 16},
    },
    "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4},
    "env": {},
    "data": {"train": {"name": "arithmetic"}},
    "cluster": {},
    "logger": {},
    "checkpointing": {},
}


@pytest.mark.parametrize(
    ("settings", "key"), [(s, k) for _, s, k in LOSS_CASES], ids=[c[0] for c in LOSS_CASES]
)
def test_launch_validation_reports_the_same_rule_with_the_full_key(settings, key):
    with pytest.raises(ConfigError) as error:
        validate_container({**MINIMAL, "loss_fn": settings})
    assert f"loss_fn.{key}" in [issue.path for issue in error.value.issues]


def test_valid_combinations_pass():
    ClippedPGLossConfig(use_cispo=True)
    ClippedPGLossConfig(sequence_level_importance_ratios=True, token_level_loss=False, **IS)
    ClippedPGLossConfig(
        **IS,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
    )
    ClippedPGLossConfig(use_kl_in_reward=True, reference_policy_kl_penalty=0.05)
    validate_container({**MINIMAL, "loss_fn": {"ratio_clip_c": 3.0}})


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"enabled": True}, "enabled"),
        ({"enabled": True, "overlong_buffer_length": 8}, "max_response_length"),
        (
            {"enabled": True, "overlong_buffer_length": 8, "max_response_length": 4},
            "overlong_buffer_length",
        ),
        (
            {
                "enabled": True,
                "overlong_buffer_length": 8,
                "max_response_length": 64,
                "stop_properly_penalty_coef": 0.0,
            },
            "stop_properly_penalty_coef",
        ),
    ],
)
def test_invalid_reward_shaping(settings, key):
    with pytest.raises(ValidationError, match=key):
        RewardShapingConfig(**settings)
    with pytest.raises(ConfigError) as error:
        validate_container(
            {**MINIMAL, "loss_fn": {}, "grpo": {**MINIMAL["grpo"], "reward_shaping": settings}}
        )  # type: ignore[dict-item]
    assert f"grpo.reward_shaping.{key}" in [issue.path for issue in error.value.issues]
