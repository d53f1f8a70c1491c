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

_TORCH_TRAINER = "the trainer here is torch with FSDP2 data parallelism (policy.dtensor_cfg)"

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
    #: ``when`` in words, for the key table (" without grpo.structured_tool_use.enabled").
    condition: str = ""

    def message(self) -> str:
        if self.handling == "warned":
            return f"ignored: {self.why}"
        return f"{self.why} (planned: {self.until})"


def _lora_with_sglang(config: MasterConfig) -> bool:
    """SGLang is the one engine that does not refit from adapters here."""
    return config.policy.dtensor_cfg.enabled and config.policy.generation.backend == "sglang"


def _without_tensor_parallel(config: MasterConfig) -> bool:
    return config.policy.dtensor_cfg.enabled and config.policy.dtensor_cfg.tensor_parallel_size == 1


def _lora_with_tensor_parallel(config: MasterConfig) -> bool:
    dtensor = config.policy.dtensor_cfg
    return dtensor.enabled and dtensor.lora_cfg.enabled and dtensor.tensor_parallel_size > 1


#: Why LoRA dropout is refused under tensor parallelism (here and by the trainer itself).
LORA_DROPOUT_WITH_TENSOR_PARALLEL = (
    "LoRA dropout with tensor_parallel_size > 1: peft draws each dropout mask from the rank's own "
    "random generator on a plain tensor, so the tensor-parallel ranks would drop different "
    "entries of the same input to the replicated A matrices, whose gradients and values would "
    "then differ from rank to rank (DTensor's synchronised RNG covers DTensors on accelerators "
    "only); set policy.dtensor_cfg.lora_cfg.dropout=0"
)


def _megatron_on(config: MasterConfig) -> bool:
    return config.policy.megatron_cfg.enabled


def _jax_on(config: MasterConfig) -> bool:
    return config.policy.jax_cfg.enabled


def _vllm_server(config: MasterConfig) -> bool:
    generation = config.policy.generation
    return generation.backend == "vllm" and generation.vllm_cfg.mode == "server"


_WITHOUT_TOOL_USE = " without grpo.structured_tool_use.enabled"


def _no_tool_use(config: MasterConfig) -> bool:
    return not config.grpo.structured_tool_use.enabled


def _screenshots_unseen(config: MasterConfig) -> bool:
    """An osworld screenshot would not reach the policy: no episode, or no images allowed."""
    return _no_tool_use(config) or not config.policy.generation.allow_multimodal_inputs


def _in_flight_updates(config: MasterConfig) -> bool:
    return config.grpo.async_grpo.in_flight_weight_updates


def _is_false(value: object, default: object) -> bool:
    return value is False


def _more_than_one(value: object, default: object) -> bool:
    return isinstance(value, int) and value > 1


def _is_float16(value: object, default: object) -> bool:
    return value == "float16"


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
    # dtensor_cfg's model-parallel degrees are the torch trainer's; the JAX trainer never reads
    # them, so a value > 1 would be silently ignored there.
    *(
        Unsupported(
            f"policy.dtensor_cfg.{name}",
            "refused",
            f"with policy.jax_cfg.enabled: {what} parallelism here is the torch trainer's; the "
            "JAX backend's mesh is policy.jax_cfg.data_parallel_size × tensor_parallel_size "
            "(set this 1; for tensor parallelism set policy.jax_cfg.tensor_parallel_size)",
            "not planned",
            when=_jax_on,
            triggered=_more_than_one,
        )
        for name, what in (
            ("tensor_parallel_size", "tensor"),
            ("context_parallel_size", "context"),
            ("expert_parallel_size", "expert"),
        )
    ),
    Unsupported(
        "cluster.num_nodes",
        "refused",
        "with policy.jax_cfg.enabled: the JAX trainer is one process over its own devices; a "
        "multi-host mesh (jax.distributed) is not set up (set 1)",
        "not planned",
        when=_jax_on,
        triggered=_more_than_one,
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
    Unsupported(
        "policy.dtensor_cfg.lora_cfg.enabled",
        "refused",
        "LoRA weight events carry the adapter alone, which the torch engine merges and vLLM "
        "loads (in process: enable_lora; a server: /v1/load_lora_adapter); the SGLang client "
        "loads none: SGLang's HTTP API has /load_lora_adapter, but SGLang does not run on the "
        "CPU machines this build is tested on, so a client for it would be untested (use "
        "backend=vllm, in process or mode=server, or backend=torch)",
        TRAINER_AT_SCALE,
        when=_lora_with_sglang,
        condition=" with backend=sglang",
    ),
    Unsupported(
        "policy.dtensor_cfg.lora_cfg.dropout",
        "refused",
        LORA_DROPOUT_WITH_TENSOR_PARALLEL,
        "not planned",
        when=_lora_with_tensor_parallel,
        condition=" with lora_cfg.enabled and tensor_parallel_size > 1",
    ),
    Unsupported(
        "policy.dtensor_cfg.sequence_parallel",
        "warned",
        "sequence parallelism splits the activations over the tensor-parallel ranks; with "
        "tensor_parallel_size=1 there are none to split over",
        "by design",
        when=_without_tensor_parallel,
        condition=" with tensor_parallel_size=1",
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
    # ---- environments ------------------------------------------------------------------------
    Unsupported(
        "env.osworld.observation_type",
        "refused",
        "screenshots are shown in episodes (grpo.structured_tool_use.enabled) to a policy "
        "allowed images (policy.generation.allow_multimodal_inputs); a single-turn sample or a "
        "text-only policy would never see them",
        "by design",
        when=_screenshots_unseen,
        condition=" without episodes and policy.generation.allow_multimodal_inputs",
    ),
    # ---- rollouts ----------------------------------------------------------------------------
    Unsupported(
        "grpo.max_rollout_turns",
        "refused",
        "a turn after the first continues on a tool's observation; without "
        "grpo.structured_tool_use.enabled there is nothing to continue on (set 1, or enable "
        "structured tool use)",
        "by design",
        when=_no_tool_use,
        condition=_WITHOUT_TOOL_USE,
        triggered=_more_than_one,
    ),
    Unsupported(
        "grpo.async_grpo.recompute_kv_cache_after_weight_updates",
        "warned",
        "every turn of an episode is prefilled from its tokens with the weights current then, "
        "so the KV cache is always recomputed after a weight update",
        "by design",
        when=_in_flight_updates,
        triggered=_is_false,
        condition=" to false with in_flight_weight_updates",
    ),
    Unsupported(
        "grpo.invalid_tool_call_advantage",
        "refused",
        "tool calls are parsed only with grpo.structured_tool_use.enabled, so no sample could "
        "earn this advantage",
        "by design",
        when=_no_tool_use,
        condition=_WITHOUT_TOOL_USE,
    ),
    Unsupported(
        "grpo.structured_tool_use.describe_tools",
        "refused",
        "tools are described in the prompts of episodes only (grpo.structured_tool_use.enabled)",
        "by design",
        when=_no_tool_use,
        condition=_WITHOUT_TOOL_USE,
    ),
    Unsupported(
        "grpo.async_grpo.in_flight_weight_updates",
        "refused",
        "single-turn generation: policy.generation.inflight_refit_policy decides what a refit "
        "does to requests in flight; this key governs refits between the turns of an episode "
        "(grpo.structured_tool_use.enabled)",
        "by design",
        when=_no_tool_use,
        condition=_WITHOUT_TOOL_USE,
    ),
    Unsupported(
        "grpo.async_grpo.max_generation_failures",
        "refused",
        "single-turn generation fails per prompt group (retried, dead-lettered at "
        "data_plane.consumer.max_deliver); this bounds failed episodes per group "
        "(grpo.structured_tool_use.enabled)",
        "by design",
        when=_no_tool_use,
        condition=_WITHOUT_TOOL_USE,
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


def _handling(rule: Unsupported) -> str:
    verb = "refused" if rule.handling == "refused" else "warns (speed/memory only)"
    return f"{verb} when set{rule.condition}: {rule.why}; {rule.until}"


def key_table(schema: type[BaseModel]) -> str:
    """Every key of ``schema`` (the ``MasterConfig``) and what this build does with it, as a
    Markdown table (what ``dockyard config keys`` prints and docs/configuration.md carries)."""
    rows = ["| key | handling |", "| --- | --- |"]
    for path in leaf_paths(schema):
        rules = rules_for(path)
        # The first pattern naming a key speaks for it; it may hold under several conditions.
        own = [rule for rule in rules if rules and rule.pattern == rules[0].pattern]
        handling = " / ".join(_handling(rule) for rule in own) or "takes effect"
        rows.append(f"| `{path}` | {handling} |")
    return "\n".join(rows) + "\n"
