"""Every key of the schema is read by the code it configures, or is listed in
``dockyard.config.capabilities.UNSUPPORTED`` (refused or warned about at launch): a new key can
never be silently ignored.

"Read" is checked in the source: the key's name is accessed (``.name`` / ``"name"``) outside
``dockyard/config/``. A name the schema uses in several places (``enabled``, ``path``, ``lr``)
proves nothing on its own, so such a key must be read through its parent (``tokenizer.name``)
or be listed in ``READ_BY`` with the modules that read it — and those modules must mention it.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from dockyard.algorithms.grpo import MasterConfig
from dockyard.config.capabilities import (
    UNSUPPORTED,
    ignored,
    key_table,
    not_implemented,
    rules_for,
)
from dockyard.config.loader import load_config
from dockyard.config.schema import leaf_paths, matches

PACKAGE = Path(__file__).resolve().parents[3] / "dockyard"
DOCS = PACKAGE.parent / "docs" / "configuration.md"

# Keys whose name the schema shares with other keys, and the modules that read them.
READ_BY: dict[str, tuple[str, ...]] = {
    "data.*.*": (
        "data/base.py",
        "data/arithmetic.py",
        "data/catalog.py",
        "consumers/trainer/build.py",
    ),
    "data.train.*": (
        "data/base.py",
        "data/arithmetic.py",
        "data/catalog.py",
        "commands/trainer.py",
    ),
    "sft.*": ("consumers/trainer/sft.py", "consumers/trainer/validation.py"),
    "sft.dev_dataset.*": (
        "data/base.py",
        "data/arithmetic.py",
        "data/catalog.py",
        "consumers/trainer/validation.py",
    ),
    "env.*.*": (
        "environments/timeouts.py",
        "environments/teacher_env.py",
        "environments/base.py",
        "environments/registry.py",
        "environments/sandbox/runner.py",
        "environments/swe/environment.py",
        "environments/code.py",
        "environments/code_env.py",
        "environments/math_env.py",
        "environments/choice_env.py",
        "environments/hle_env.py",
        "environments/program_bench_env.py",
        "environments/terminal_bench_env.py",
        "environments/gdpval_env.py",
        "environments/judge.py",
        "environments/osworld/",
        "environments/tools/desktop.py",
        "consumers/scorer.py",
        "commands/score.py",
    ),
    "logger.*.*": ("observability/metrics/",),
    "run.tracing.*": ("observability/tracing.py",),
    "policy.optimizer.*": ("consumers/trainer/optim.py",),
    "grpo.worker_trust.enabled": ("consumers/trainer/loop.py",),
    "policy.scheduler.*": ("consumers/trainer/optim.py",),
    "policy.dtensor_cfg.enabled": ("config/capabilities.py",),
    "policy.dtensor_cfg.sequence_parallel": ("consumers/trainer/policy_trainer.py",),
    # The mesh's cp ranks (commands/trainer.py joins them) and the trainer's check of them.
    "policy.dtensor_cfg.context_parallel_size": (
        "consumers/trainer/policy_trainer.py",
        "commands/trainer.py",
    ),
    # The mesh's ep ranks (commands/trainer.py joins them) and the trainer's check of them.
    "policy.dtensor_cfg.expert_parallel_size": (
        "consumers/trainer/policy_trainer.py",
        "commands/trainer.py",
    ),
    "policy.jax_cfg.*": ("consumers/trainer/backend.py", "consumers/trainer/jax_backend/mesh.py"),
    # The budgets are resolved by PolicyConfig.token_budget, which micro_batches.py calls.
    "policy.sequence_packing.*": (
        "consumers/trainer/micro_batches.py",
        "config/sections/policy.py",
    ),
    "policy.dynamic_batching.*": (
        "consumers/trainer/micro_batches.py",
        "config/sections/policy.py",
    ),
    "policy.generation.vllm_cfg.*": ("engines/",),
    "grpo.adv_estimator.*": ("algorithms/advantages/",),
    "on_policy_distillation.teachers.*.*": ("environments/teacher_env.py",),
    # Resolved against the run directory by the section itself; the trainer loop calls it.
    "checkpointing.checkpoint_dir": ("config/sections/checkpointing.py",),
    # Read by MasterConfig's cross-section rules (batch shape, async GRPO, OPD); they were read
    # there when MasterConfig lived in algorithms/grpo.py, before it moved to config/.
    "policy.train_global_batch_size": ("config/master.py",),
    "grpo.reward_scaling.enabled": ("config/master.py",),
    "grpo.reward_shaping.enabled": ("config/master.py",),
    "on_policy_distillation.enabled": ("config/master.py",),
    "logger.log_dir": ("config/sections/logger.py",),
    "data_plane.weight_transport.base_url": ("broker/weight_blobs/factory.py",),
}


@cache
def sources(under: str = "") -> dict[Path, str]:
    root = PACKAGE / under
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    return {
        path: path.read_text()
        for path in files
        if under.startswith("config/") or "config" not in path.relative_to(PACKAGE).parts[:1]
    }


def mentions(texts: dict[Path, str], name: str, *, parent: str | None = None) -> bool:
    """``texts`` access ``name`` (``parent.name`` when a parent is given)."""
    if parent is not None:
        pattern = re.compile(rf"\b{parent}\.{name}\b")
    else:
        pattern = re.compile(rf"(\.{name}\b|[\"']{name}[\"'])")
    return any(pattern.search(text) for text in texts.values())


PATHS = leaf_paths(MasterConfig)
NAME_COUNTS = Counter(path.rsplit(".", 1)[-1] for path in PATHS)


def reader_problem(path: str) -> str | None:
    """Why ``path`` has no reader, or None."""
    parts = path.split(".")
    name = parts[-1]
    if NAME_COUNTS[name] == 1 and mentions(sources(), name):
        return None
    parent = next(part for part in reversed(parts[:-1]) if part != "*")
    if NAME_COUNTS[name] > 1 and mentions(sources(), name, parent=parent):
        return None
    declared = [modules for pattern, modules in READ_BY.items() if matches(pattern, path)]
    if not declared:
        return f"nothing outside config/ reads {name!r} (as {parent}.{name} if it is shared)"
    texts = {p: t for modules in declared for m in modules for p, t in sources(m).items()}
    return None if mentions(texts, name) else f"no READ_BY module {declared} reads {name!r}"


@pytest.mark.parametrize("path", PATHS)
def test_every_key_is_read_or_refused_or_warned(path):
    if rules_for(path):
        return
    problem = reader_problem(path)
    assert problem is None, f"{path}: {problem} — implement it, or list it in UNSUPPORTED"


@pytest.mark.parametrize("rule", UNSUPPORTED, ids=lambda rule: rule.pattern)
def test_every_unsupported_entry_names_keys_of_the_schema(rule):
    assert any(matches(rule.pattern, path) for path in PATHS), rule.pattern


@pytest.mark.parametrize(
    ("override", "path"),
    [
        # Without grpo.structured_tool_use.enabled (the quickstart): nothing they could act on.
        ("grpo.max_rollout_turns=3", "grpo.max_rollout_turns"),
        ("grpo.invalid_tool_call_advantage=-1.0", "grpo.invalid_tool_call_advantage"),
        (
            "grpo.async_grpo.in_flight_weight_updates=true",
            "grpo.async_grpo.in_flight_weight_updates",
        ),
        ("grpo.async_grpo.max_generation_failures=3", "grpo.async_grpo.max_generation_failures"),
        (
            "grpo.structured_tool_use.describe_tools=false",
            "grpo.structured_tool_use.describe_tools",
        ),
        # cluster.* takes effect now: tests/unit/fleet/test_launch_ranks.py.
        # data.*.path, data.system_prompt and policy.tokenizer.chat_template take effect now:
        # tests/unit/data/test_file_datasets.py and test_chat_prompts.py show it.
        ("policy.generation.colocated.enabled=true", "policy.generation.colocated.enabled"),
    ],
)
def test_keys_the_audit_found_ignored_are_refused_with_their_path(override, path):
    config = load_config("configs/quickstart.yaml", [override])
    assert [issue.path for issue in not_implemented(config)] == [path]


def test_multi_turn_settings_take_effect_with_structured_tool_use():
    config = load_config(
        "configs/quickstart.yaml",
        [
            "grpo.structured_tool_use.enabled=true",
            "grpo.max_rollout_turns=4",
            "grpo.invalid_tool_call_advantage=-1.0",
            "grpo.malformed_thinking_advantage=-1.0",
            "grpo.async_grpo.in_flight_weight_updates=true",
            "grpo.async_grpo.recompute_kv_cache_after_weight_updates=true",
            "grpo.async_grpo.max_generation_failures=2",
        ],
    )
    assert not_implemented(config) == []
    assert ignored(config) == []


def test_keeping_the_kv_cache_after_a_weight_update_is_warned_about():
    # Every turn is prefilled with the weights current then: the cache is always recomputed.
    config = load_config(
        "configs/quickstart.yaml",
        ["grpo.structured_tool_use.enabled=true", "grpo.async_grpo.in_flight_weight_updates=true"],
    )
    assert [issue.path for issue in ignored(config)] == [
        "grpo.async_grpo.recompute_kv_cache_after_weight_updates"
    ]


def test_vllm_settings_of_a_server_are_refused_in_server_mode_only():
    vllm = [
        "policy.generation.backend=vllm",
        "policy.generation.vllm_cfg.gpu_memory_utilization=0.9",
        "policy.generation.vllm_cfg.max_model_len=64",
    ]
    inprocess = load_config("configs/quickstart.yaml", vllm)
    assert not_implemented(inprocess) == []
    server = load_config(
        "configs/quickstart.yaml",
        [
            *vllm,
            "policy.generation.vllm_cfg.mode=server",
            "policy.generation.vllm_cfg.server_urls=[http://127.0.0.1:8000]",
        ],
    )
    assert [issue.path for issue in not_implemented(server)] == [
        "policy.generation.vllm_cfg.gpu_memory_utilization",
        "policy.generation.vllm_cfg.max_model_len",
    ]


def test_the_quickstart_sets_nothing_unsupported():
    assert not_implemented(load_config("configs/quickstart.yaml", [])) == []


def test_docs_list_every_key_as_the_build_handles_it():
    # docs/configuration.md carries `dockyard config keys` verbatim
    assert key_table(MasterConfig) in DOCS.read_text(), "regenerate with `dockyard config keys`"
