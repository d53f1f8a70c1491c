"""What this build can run, checked when a command is about to start work.

The configuration surface follows the spec in full, so every file of the config family loads
and validates (``dockyard config validate``). Some of what it can express is not implemented
here: another trainer backend, model parallelism, LoRA, multi-turn rollouts. The commands that
start work (``run``, ``trainer``, ``rollout``, ``score``) refuse those settings with their key
path rather than silently computing something else, and warn about settings that would only
change speed or memory and are ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dockyard.config.errors import ConfigIssue

if TYPE_CHECKING:
    from dockyard.algorithms.grpo import MasterConfig

_TORCH_TRAINER = "the trainer here is single-process torch (policy.dtensor_cfg)"


def not_implemented(config: MasterConfig) -> list[ConfigIssue]:
    """Settings that would change what is trained or generated, which this build cannot do."""
    policy = config.policy
    dtensor = policy.dtensor_cfg
    issues: list[ConfigIssue] = []
    if policy.megatron_cfg.enabled:
        issues.append(
            ConfigIssue(
                "policy.megatron_cfg.enabled",
                f"the Megatron trainer backend is not in this build; {_TORCH_TRAINER}",
            )
        )
    if policy.jax_cfg.enabled:
        issues.append(
            ConfigIssue(
                "policy.jax_cfg.enabled",
                f"the JAX trainer backend is not in this build; {_TORCH_TRAINER}",
            )
        )
    if config.grpo.max_rollout_turns > 1:
        issues.append(
            ConfigIssue(
                "grpo.max_rollout_turns",
                f"{config.grpo.max_rollout_turns}: multi-turn rollouts are not implemented; "
                "rollout workers generate one turn per sample (set 1)",
            )
        )
    data = config.data
    if data.extra_train_dataloaders:
        issues.append(
            ConfigIssue(
                "data.extra_train_dataloaders",
                "several training dataloaders are not implemented; only data.train is dispatched",
            )
        )
    for path, processor in (
        ("data.default_processor", data.default_processor),
        ("data.train.processor", data.train.processor),
    ):
        if processor not in (None, "default"):
            issues.append(
                ConfigIssue(path, f"{processor!r}: only the 'default' processor is built in")
            )
    if not dtensor.enabled:
        return issues  # its settings below apply to no trainer
    for name in ("tensor_parallel_size", "context_parallel_size", "expert_parallel_size"):
        size = getattr(dtensor, name)
        if size > 1:
            issues.append(
                ConfigIssue(
                    f"policy.dtensor_cfg.{name}",
                    f"{size}: model parallelism is not implemented; the trainer holds the "
                    "whole model on one device (set 1)",
                )
            )
    if dtensor.lora_cfg.enabled:
        issues.append(
            ConfigIssue(
                "policy.dtensor_cfg.lora_cfg.enabled",
                "LoRA is not implemented; the trainer updates every parameter",
            )
        )
    return issues


def ignored(config: MasterConfig) -> list[ConfigIssue]:
    """Settings that would only change speed or memory, which this build ignores."""
    policy = config.policy
    dtensor = policy.dtensor_cfg
    on = dtensor.enabled
    issues = [
        ConfigIssue(path, f"ignored: {why}")
        for path, enabled, why in (
            (
                "policy.sequence_packing.enabled",
                policy.sequence_packing.enabled,
                "micro-batches are padded to their longest sequence",
            ),
            (
                "policy.dynamic_batching.enabled",
                policy.dynamic_batching.enabled,
                "micro-batches have train_micro_batch_size sequences",
            ),
            ("policy.dtensor_cfg.cpu_offload", on and dtensor.cpu_offload, _TORCH_TRAINER),
            (
                "policy.dtensor_cfg.activation_checkpointing",
                on and dtensor.activation_checkpointing,
                _TORCH_TRAINER,
            ),
            (
                "policy.dtensor_cfg.sequence_parallel",
                on and dtensor.sequence_parallel,
                _TORCH_TRAINER,
            ),
        )
        if enabled
    ]
    issues += [
        ConfigIssue(
            f"env.{name}.num_scoring_workers",
            "ignored: the number of scorer processes is run.num_scorers (or how many "
            "`dockyard score` you start)",
        )
        for name, env_config in _environment_sections(config)
        if getattr(env_config, "num_scoring_workers", 1) > 1
    ]
    return issues


def _environment_sections(config: MasterConfig) -> list[tuple[str, object]]:
    env = config.env
    named = [(name, getattr(env, name)) for name in type(env).model_fields]
    named += list((env.model_extra or {}).items())
    return [(name, section) for name, section in named if section is not None]
