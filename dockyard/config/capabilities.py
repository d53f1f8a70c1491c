"""What this build can run, checked when a command is about to start work.

The configuration surface follows the spec in full, so every file of the config family loads
and validates (``dockyard config validate``). Some of what it can express is not implemented
here. Every such key is listed once, in :data:`UNSUPPORTED`, with what happens when a config
sets it away from its default: the commands that start work (``run``, ``trainer``, ``rollout``,
``score``) *refuse* it with its key path (exit status 2) when it would change what is trained or
generated, and *warn* once when it would only change speed or memory. Every other key of the
schema is read by the code that it configures; ``tests/unit/config/test_key_coverage.py`` walks
the whole schema and fails for a key that has neither a reader nor an entry here, so a new key
cannot be silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from dockyard.config.errors import ConfigIssue
from dockyard.config.schema import leaf_paths, matches, set_values

if TYPE_CHECKING:
    from dockyard.config.master import MasterConfig

# The open work that will implement what is refused, named in every refusal.
TRAINER_AT_SCALE = "issue #21 (the trainer on GPUs, sharded, LoRA, packing)"
REAL_DATA = "issue #22 (real data and the config family's environments)"
MULTI_TURN = "issue #23 (multi-turn agentic rollouts and tool use)"

_TORCH_TRAINER = "the trainer here is single-process torch (policy.dtensor_cfg)"

Handling = Literal["refused", "warned"]


def _always(config: MasterConfig) -> bool:
    return True


def _differs(value: object, default: object) -> bool:
    return value != default


@dataclass(frozen=True)
class Unsupported:
    """A key (``*`` = any one key) this build does not implement.

    It applies when ``when(config)`` holds and ``triggered(value, default)`` — by default, when
    the value differs from the schema's default (the default is what the build does).
    """

    pattern: str
    handling: Handling
    why: str
    until: str
    when: Callable[[MasterConfig], bool] = _always
    triggered: Callable[[object, object], bool] = _differs

    def message(self) -> str:
        if self.handling == "warned":
            return f"ignored: {self.why}"
        return f"{self.why} (planned: {self.until})"


def _dtensor_on(config: MasterConfig) -> bool:
    return config.policy.dtensor_cfg.enabled


def _lora_on(config: MasterConfig) -> bool:
    return config.policy.dtensor_cfg.enabled and config.policy.dtensor_cfg.lora_cfg.enabled


def _megatron_on(config: MasterConfig) -> bool:
    return config.policy.megatron_cfg.enabled


def _jax_on(config: MasterConfig) -> bool:
    return config.policy.jax_cfg.enabled


def _vllm_server(config: MasterConfig) -> bool:
    generation = config.policy.generation
    return generation.backend == "vllm" and generation.vllm_cfg.mode == "server"


def _more_than_one(value: object, default: object) -> bool:
    return isinstance(value, int) and value > 1


def _not_default_processor(value: object, default: object) -> bool:
    return value not in (None, "default")


def _is_float16(value: object, default: object) -> bool:
    return value == "float16"


def _some_gpu(value: object, default: object) -> bool:
    return isinstance(value, int) and value > 0


_SERVER_SIDE_VLLM_KEYS = (
    "precision",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "expert_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "enforce_eager",
    "env_vars",
)

UNSUPPORTED: tuple[Unsupported, ...] = (
    # ---- the trainer backend and its parallelism -------------------------------------------
    Unsupported(
        "policy.megatron_cfg.enabled",
        "refused",
        f"the Megatron trainer backend is not in this build; {_TORCH_TRAINER}",
        "not planned",
    ),
    Unsupported(
        "policy.megatron_cfg.*",
        "refused",
        "configures the Megatron backend, which is not in this build",
        "not planned",
        when=_megatron_on,
    ),
    # The JAX backend (policy.jax_cfg, dockyard/consumers/trainer/jax_backend/) computes in
    # float32 or bfloat16 and runs fixed-shape micro-batches (each shape is one compilation).
    Unsupported(
        "policy.precision",
        "refused",
        "float16 with policy.jax_cfg.enabled: the JAX trainer backend computes in float32 or "
        "bfloat16 (float16 needs loss scaling, which it does not do)",
        "not planned",
        when=_jax_on,
        triggered=_is_float16,
    ),
    *(
        Unsupported(
            f"policy.{name}.enabled",
            "warned",
            "with policy.jax_cfg.enabled: the JAX trainer backend runs fixed micro-batches of "
            "policy.train_micro_batch_size rows padded to a fixed width (one compilation per "
            "shape)",
            "not planned",
            when=_jax_on,
        )
        for name in ("sequence_packing", "dynamic_batching")
    ),
    *(
        Unsupported(
            f"policy.dtensor_cfg.{name}",
            "refused",
            "model parallelism is not implemented; the trainer holds the whole model on one "
            "device (set 1)",
            TRAINER_AT_SCALE,
            when=_dtensor_on,
            triggered=_more_than_one,
        )
        for name in ("tensor_parallel_size", "context_parallel_size", "expert_parallel_size")
    ),
    Unsupported(
        "policy.dtensor_cfg.lora_cfg.enabled",
        "refused",
        "LoRA is not implemented; the trainer updates every parameter",
        TRAINER_AT_SCALE,
        when=_dtensor_on,
    ),
    Unsupported(
        "policy.dtensor_cfg.lora_cfg.*",
        "refused",
        "configures LoRA, which is not implemented",
        TRAINER_AT_SCALE,
        when=_lora_on,
    ),
    *(
        Unsupported(
            f"policy.dtensor_cfg.{name}",
            "warned",
            _TORCH_TRAINER,
            TRAINER_AT_SCALE,
            when=_dtensor_on,
        )
        for name in ("cpu_offload", "activation_checkpointing", "sequence_parallel")
    ),
    Unsupported(
        "cluster.gpus_per_node",
        "refused",
        "the trainer is one process on the CPU; it uses no GPU (set 0)",
        TRAINER_AT_SCALE,
        triggered=_some_gpu,
    ),
    Unsupported(
        "cluster.num_nodes",
        "refused",
        "the trainer is one process on one node (set 1)",
        TRAINER_AT_SCALE,
    ),
    Unsupported(
        "policy.generation.colocated.enabled",
        "refused",
        "generation is never colocated with training here: rollout workers are separate "
        "processes that refit from weight events",
        TRAINER_AT_SCALE,
    ),
    *(
        Unsupported(
            f"policy.generation.vllm_cfg.{name}",
            "refused",
            "with vllm_cfg.mode=server the vLLM servers are launched by you: set this on the "
            "server's command line, not here",
            "by design",
            when=_vllm_server,
        )
        for name in _SERVER_SIDE_VLLM_KEYS
    ),
    # ---- data --------------------------------------------------------------------------------
    Unsupported(
        "data.extra_train_dataloaders",
        "refused",
        "several training dataloaders are not implemented; only data.train is dispatched",
        REAL_DATA,
    ),
    *(
        Unsupported(
            path,
            "refused",
            "only the 'default' processor is built in",
            REAL_DATA,
            triggered=_not_default_processor,
        )
        for path in ("data.default_processor", "data.*.processor", "sft.dev_dataset.processor")
    ),
    # ---- rollouts ----------------------------------------------------------------------------
    Unsupported(
        "grpo.max_rollout_turns",
        "refused",
        "multi-turn rollouts are not implemented; rollout workers generate one turn per "
        "sample (set 1)",
        MULTI_TURN,
    ),
    Unsupported(
        "grpo.structured_tool_use.*",
        "refused",
        "structured tool calls are not parsed or executed; rollouts are single-turn text",
        MULTI_TURN,
    ),
    *(
        Unsupported(
            f"grpo.{name}",
            "refused",
            "no environment flags invalid tool calls or malformed thinking yet, so this "
            "advantage override would never apply",
            MULTI_TURN,
        )
        for name in ("invalid_tool_call_advantage", "malformed_thinking_advantage")
    ),
    Unsupported(
        "grpo.async_grpo.in_flight_weight_updates",
        "refused",
        "a rollout worker refits between batches (policy.generation.inflight_refit_policy "
        "says what happens to requests in flight); mid-request weight updates are not "
        "implemented",
        MULTI_TURN,
    ),
    Unsupported(
        "grpo.async_grpo.recompute_kv_cache_after_weight_updates",
        "refused",
        "weights never change under a running request here, so there is no KV cache to recompute",
        MULTI_TURN,
    ),
    Unsupported(
        "grpo.async_grpo.max_generation_failures",
        "refused",
        "a failed generation is retried and dead-lettered per prompt group "
        "(data_plane.consumer.max_deliver); a run-wide failure budget is not implemented",
        MULTI_TURN,
    ),
    Unsupported(
        "env.*.num_scoring_workers",
        "warned",
        "the number of scorer processes is run.num_scorers (or how many `dockyard score` you "
        "start)",
        "by design",
        triggered=_more_than_one,
    ),
)


def _issues(config: MasterConfig, handling: Handling) -> list[ConfigIssue]:
    """In the schema's key order; the first rule naming a key speaks for it (a specific rule is
    listed before its section's)."""
    rules = [rule for rule in UNSUPPORTED if rule.when(config)]
    issues: list[ConfigIssue] = []
    for path, value, default in set_values(config):
        rule = next((rule for rule in rules if matches(rule.pattern, path)), None)
        if rule is not None and rule.handling == handling and rule.triggered(value, default):
            issues.append(ConfigIssue(path, rule.message()))
    return issues


def not_implemented(config: MasterConfig) -> list[ConfigIssue]:
    """Settings that would change what is trained or generated, which this build cannot do."""
    return _issues(config, "refused")


def ignored(config: MasterConfig) -> list[ConfigIssue]:
    """Settings that would only change speed or memory, which this build ignores."""
    return _issues(config, "warned")


def rules_for(path: str) -> list[Unsupported]:
    """The entries of :data:`UNSUPPORTED` that name ``path`` (a schema path, ``*`` included)."""
    return [rule for rule in UNSUPPORTED if matches(rule.pattern, path)]


def key_table(schema: type[BaseModel]) -> str:
    """Every key of ``schema`` (the ``MasterConfig``) and what this build does with it, as a
    Markdown table (what ``dockyard config keys`` prints and docs/configuration.md carries)."""
    rows = ["| key | handling |", "| --- | --- |"]
    for path in leaf_paths(schema):
        rules = rules_for(path)
        if not rules:
            handling = "takes effect"
        else:
            rule = rules[0]
            verb = "refused" if rule.handling == "refused" else "warns (speed/memory only)"
            handling = f"{verb} when set: {rule.why}; {rule.until}"
        rows.append(f"| `{path}` | {handling} |")
    return "\n".join(rows) + "\n"
