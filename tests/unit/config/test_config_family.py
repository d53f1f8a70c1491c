"""The config family under ``configs/``: every runnable file validates cleanly and documents its
topology and target hardware in its header comment."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config_report

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"
FAMILY = [
    "grpo_swe.yaml",
    "grpo_swe_pro.yaml",
    "grpo_swe_sglang.yaml",
    "grpo_swe_jax.yaml",
    "grpo_program_bench.yaml",
    "grpo_terminal_bench.yaml",
    "grpo_osworld.yaml",
    "grpo_gdpval.yaml",
    "grpo_gdpval_agentic.yaml",
    "grpo_hle.yaml",
    "gpqa.yaml",
    "sft.yaml",
    "v4_consolidation.yaml",
    "quickstart.yaml",
    "multiturn_tools.yaml",
]


# Recipe files (`dockyard recipe v4`): their stages are family configs with overrides, each
# validated by plan_recipe (tests/integration/e2e/test_config_family_runs.py).
RECIPES = ["v4_recipe.yaml"]


def test_the_family_is_complete():
    assert sorted(p.name for p in CONFIG_DIR.glob("*.yaml")) == sorted(FAMILY + RECIPES)


@pytest.mark.parametrize("name", FAMILY)
def test_config_validates_without_warnings(name):
    report = load_config_report(CONFIG_DIR / name)
    assert report.warnings == [], [str(w) for w in report.warnings]


@pytest.mark.parametrize("name", FAMILY)
def test_config_header_documents_topology(name):
    header = (CONFIG_DIR / name).read_text().split("\n\n")[0]
    assert header.startswith("#")
    assert "topology" in header.lower()


def test_the_shared_base_is_not_runnable_alone():
    with pytest.raises(ConfigError, match=r"policy\.model_name"):
        load_config_report(CONFIG_DIR / "base" / "grpo_base.yaml")


def test_family_members_share_the_grpo_core():
    swe = load_config_report(CONFIG_DIR / "grpo_swe.yaml").config
    hle = load_config_report(CONFIG_DIR / "grpo_hle.yaml").config
    assert swe.loss_fn == hle.loss_fn
    assert swe.grpo.async_grpo.enabled and hle.grpo.async_grpo.enabled


def test_v4_consolidation_meets_the_opd_constraints():
    cfg = load_config_report(CONFIG_DIR / "v4_consolidation.yaml").config
    assert cfg.grpo.adv_estimator.name == "opd"
    assert cfg.grpo.async_grpo.enabled
    assert cfg.data_plane is None
    assert not cfg.policy.skip_prev_logprobs
    assert set(cfg.on_policy_distillation.teacher_model_by_agent_name.values()) <= set(
        cfg.on_policy_distillation.teachers
    )


def test_examples_path_from_the_spec_points_at_the_family():
    examples = CONFIG_DIR.parent / "examples" / "configs" / "grpo_swe.yaml"
    assert examples.resolve() == (CONFIG_DIR / "grpo_swe.yaml").resolve()
