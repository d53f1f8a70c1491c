"""``MasterConfig``: the whole run, one typed model per section, plus the launch-time rules.

Section models live in :mod:`dockyard.config.sections`; this module assembles them and holds
the rules that span sections (async GRPO, on-policy distillation, batch shape). Rules inside one
section live on that section's model so that building it in code runs the same checks.
:mod:`dockyard.algorithms.grpo` re-exports ``MasterConfig`` for the spec's import path.

Names that other packages register (advantage estimators) are not known here: ``config`` imports
no other dockyard package. The caller that knows the registries passes them in as
:class:`RegisteredNames` (the launch path does, see ``dockyard.algorithms.grpo.registered_names``)
and :meth:`MasterConfig.registered_name_issues` refuses a name outside them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ConfigDict, Field

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue
from dockyard.config.sections.checkpointing import CheckpointingConfig
from dockyard.config.sections.cluster import ClusterConfig
from dockyard.config.sections.data import DataConfig
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.config.sections.distillation import OnPolicyDistillationConfig
from dockyard.config.sections.env import EnvConfig
from dockyard.config.sections.grpo import GRPOConfig
from dockyard.config.sections.logger import LoggerConfig
from dockyard.config.sections.loss import ClippedPGLossConfig
from dockyard.config.sections.policy import PolicyConfig
from dockyard.config.sections.run import RunConfig
from dockyard.config.sections.sft import SFTConfig

OPD_ESTIMATOR = "opd"


@dataclass(frozen=True)
class RegisteredNames:
    """The names registered, in code outside ``config/``, for keys that select an implementation."""

    #: ``grpo.adv_estimator.name``: the advantage estimator registry, in registration order.
    advantage_estimators: Sequence[str]


class MasterConfig(Section):
    """The resolved configuration of a run. Extra top-level keys are allowed and kept."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    policy: PolicyConfig
    loss_fn: ClippedPGLossConfig
    grpo: GRPOConfig
    env: EnvConfig
    data: DataConfig
    cluster: ClusterConfig
    logger: LoggerConfig
    checkpointing: CheckpointingConfig
    data_plane: DataPlaneConfig | None = Field(
        None, description="None = the in-memory plane in one process"
    )
    on_policy_distillation: OnPolicyDistillationConfig = Field(
        default_factory=OnPolicyDistillationConfig
    )
    sft: SFTConfig | None = Field(None, description="supervised warm start before GRPO")
    run: RunConfig = Field(default_factory=RunConfig)

    def rule_issues(self) -> list[ConfigIssue]:
        return [issue for rule in self.cross_section_rules() for issue in rule()]

    def cross_section_rules(self) -> list[Callable[[], list[ConfigIssue]]]:
        """The rules spanning sections; the loader also runs them on a partly valid config."""
        return [
            self._batch_shape_issues,
            self._async_issues,
            self._estimator_issues,
            self._prev_logprob_issues,
            self._parallelism_issues,
            self._context_parallel_issues,
            self._expert_parallel_issues,
            self._sequence_budget_issues,
        ]

    def _batch_shape_issues(self) -> list[ConfigIssue]:
        grpo = self.grpo
        rollouts_per_step = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
        if rollouts_per_step != self.policy.train_global_batch_size:
            return [
                ConfigIssue(
                    "policy.train_global_batch_size",
                    f"must equal grpo.num_prompts_per_step × grpo.num_generations_per_prompt "
                    f"= {grpo.num_prompts_per_step} × {grpo.num_generations_per_prompt} "
                    f"= {rollouts_per_step}, got {self.policy.train_global_batch_size}",
                )
            ]
        return []

    def _async_issues(self) -> list[ConfigIssue]:
        grpo = self.grpo
        if not grpo.async_grpo.enabled:
            return []
        why = "is not supported with grpo.async_grpo.enabled=true"
        issues: list[ConfigIssue] = []
        if grpo.use_dynamic_sampling:
            issues.append(ConfigIssue("grpo.use_dynamic_sampling", f"dynamic sampling {why}"))
        if grpo.reward_scaling.enabled:
            issues.append(ConfigIssue("grpo.reward_scaling.enabled", f"reward scaling {why}"))
        if grpo.reward_shaping.enabled:
            issues.append(ConfigIssue("grpo.reward_shaping.enabled", f"reward shaping {why}"))
        if self.data.extra_train_dataloaders:
            issues.append(
                ConfigIssue("data.extra_train_dataloaders", f"multiple dataloaders {why}")
            )
        if not self.loss_fn.use_importance_sampling_correction:
            issues.append(
                ConfigIssue(
                    "loss_fn.use_importance_sampling_correction",
                    "async GRPO trains on off-policy samples and needs IS correction: set it true",
                )
            )
        return issues

    def registered_name_issues(self, registered: RegisteredNames) -> list[ConfigIssue]:
        """Names that select an implementation must be registered (checked at launch)."""
        name = self.grpo.adv_estimator.name
        known = registered.advantage_estimators
        if name not in known:
            return [
                ConfigIssue(
                    "grpo.adv_estimator.name",
                    f"unknown estimator {name!r}; choose one of {', '.join(known)}",
                )
            ]
        return []

    def _estimator_issues(self) -> list[ConfigIssue]:
        if self.grpo.adv_estimator.name != OPD_ESTIMATOR:
            return []
        issues: list[ConfigIssue] = []
        if not self.grpo.async_grpo.enabled:
            issues.append(
                ConfigIssue(
                    "grpo.async_grpo.enabled",
                    "the OPD estimator runs on the async path: set grpo.async_grpo.enabled=true",
                )
            )
        if self.policy.skip_prev_logprobs:
            issues.append(
                ConfigIssue(
                    "policy.skip_prev_logprobs",
                    "OPD's advantage subtracts prev_logprobs, which this setting zeroes: "
                    "set it false",
                )
            )
        if not self.on_policy_distillation.enabled:
            issues.append(
                ConfigIssue(
                    "on_policy_distillation.enabled",
                    "grpo.adv_estimator.name=opd needs on_policy_distillation.enabled=true",
                )
            )
        if self.loss_fn.sequence_level_importance_ratios:
            # OPD's advantage is per token (teacher − π_old); GSPO's one ratio per sequence
            # gives every token of a sequence the same weight, so the gradient would see only
            # the sequence mean of the teacher's per-token signal.
            issues.append(
                ConfigIssue(
                    "loss_fn.sequence_level_importance_ratios",
                    "GSPO's sequence ratio averages grpo.adv_estimator.name=opd's per-token "
                    "advantages over each sequence (every token gets the sequence's mean "
                    "teacher signal): use token ratios with opd",
                )
            )
        return issues

    def _prev_logprob_issues(self) -> list[ConfigIssue]:
        if not self.policy.skip_prev_logprobs:
            return []
        issues: list[ConfigIssue] = []
        # force_on_policy_ratio makes the loss take π_old := sg(π_θ) before the IS weight
        # exp(prev − gen) is formed, so the weight never sees the zeros. That is exact, not an
        # approximation: a step is one optimizer update on its whole batch
        # (train_global_batch_size = the step's samples), so at the forward π_θ still *is* the
        # weights the step started from.
        if (
            self.loss_fn.use_importance_sampling_correction
            and not self.loss_fn.force_on_policy_ratio
        ):
            issues.append(
                ConfigIssue(
                    "policy.skip_prev_logprobs",
                    "IS correction weighs by exp(prev − gen) and needs real prev_logprobs: "
                    "set loss_fn.force_on_policy_ratio=true (π_old := sg(π_θ)), or set this false",
                )
            )
        # These read prev_logprobs before the loss (which alone replaces them): zeros there would
        # filter or penalise against a made-up π_old.
        if self.grpo.seq_logprob_error_threshold is not None:
            issues.append(
                ConfigIssue(
                    "policy.skip_prev_logprobs",
                    "grpo.seq_logprob_error_threshold compares the engine's log-probs with "
                    "prev_logprobs, which this setting zeroes: set it false",
                )
            )
        if self.loss_fn.use_kl_in_reward:
            issues.append(
                ConfigIssue(
                    "policy.skip_prev_logprobs",
                    "loss_fn.use_kl_in_reward takes the KL of prev_logprobs against the "
                    "reference, which this setting zeroes: set it false",
                )
            )
        if not (self.loss_fn.force_on_policy_ratio or self.loss_fn.disable_ppo_ratio):
            issues.append(
                ConfigIssue(
                    "policy.skip_prev_logprobs",
                    "without prev_logprobs the PPO ratio is meaningless: also set "
                    "loss_fn.force_on_policy_ratio=true, or set this false",
                )
            )
        return issues

    def _context_parallel_issues(self) -> list[ConfigIssue]:
        """What context parallelism (the all-gather-KV attention over padded micro-batches,
        dockyard.consumers.trainer.context_parallel) is not combined with."""
        policy = self.policy
        dtensor = policy.dtensor_cfg
        if not dtensor.enabled or dtensor.context_parallel_size == 1:
            return []
        combined = {
            "policy.dtensor_cfg.tensor_parallel_size": (
                dtensor.tensor_parallel_size > 1,
                "tensor parallelism splits the attention heads the context-parallel attention "
                "gathers: set one of the two to 1",
            ),
            "policy.sequence_packing.enabled": (
                policy.sequence_packing.enabled,
                "packed rows need block-diagonal masks; the context-parallel attention is plain "
                "causal over right-padded rows: set it false (dynamic_batching is supported)",
            ),
            "policy.dtensor_cfg.lora_cfg.enabled": (
                dtensor.lora_cfg.enabled,
                "LoRA with context parallelism is not tested here: set it false",
            ),
            "policy.dtensor_cfg.activation_checkpointing": (
                dtensor.activation_checkpointing,
                "recomputing a layer in backward would re-run its K/V all-gathers, which is not "
                "tested here: set it false",
            ),
        }
        return _not_combined_with("context_parallel_size > 1", combined)

    def _expert_parallel_issues(self) -> list[ConfigIssue]:
        """What expert parallelism (dockyard.consumers.trainer.expert_parallel: experts sharded
        over ep ranks that are also data-parallel ranks) is not combined with."""
        dtensor = self.policy.dtensor_cfg
        if not dtensor.enabled or dtensor.expert_parallel_size == 1:
            return []
        combined = {
            "policy.dtensor_cfg.tensor_parallel_size": (
                dtensor.tensor_parallel_size > 1,
                "the ep ranks borrow from data parallelism; a (dp, tp, ep) mesh and a "
                "tensor-parallel plan for the experts are not built here: set one of them to 1",
            ),
            "policy.dtensor_cfg.context_parallel_size": (
                dtensor.context_parallel_size > 1,
                "a (dp, cp, ep) mesh is not built here: set one of them to 1",
            ),
            "policy.dtensor_cfg.lora_cfg.enabled": (
                dtensor.lora_cfg.enabled,
                "LoRA targets nn.Linear projections; the fused expert weights split over the ep "
                "ranks are not adapted, and the combination is not tested here: set it false",
            ),
            "policy.dtensor_cfg.cpu_offload": (
                dtensor.cpu_offload,
                "FSDP2 offloads the shards it manages; the experts, sharded over the ep ranks "
                "outside FSDP2, would stay on the device: set it false",
            ),
        }
        return _not_combined_with("expert_parallel_size > 1", combined)

    def _parallelism_issues(self) -> list[ConfigIssue]:
        total_gpus = self.cluster.total_gpus
        dtensor = self.policy.dtensor_cfg
        if total_gpus == 0 or not dtensor.enabled:
            return []
        model_parallel = dtensor.tensor_parallel_size * dtensor.context_parallel_size
        if total_gpus % dtensor.expert_parallel_size:
            return [
                ConfigIssue(
                    "policy.dtensor_cfg.expert_parallel_size",
                    f"{dtensor.expert_parallel_size} must divide the cluster's {total_gpus} GPUs "
                    "(the ep ranks are data-parallel ranks)",
                )
            ]
        if total_gpus % model_parallel:
            return [
                ConfigIssue(
                    "policy.dtensor_cfg.tensor_parallel_size",
                    f"tensor × context parallel = {model_parallel} must divide the cluster's "
                    f"{total_gpus} GPUs",
                )
            ]
        return []

    def _sequence_budget_issues(self) -> list[ConfigIssue]:
        prompt_cap = self.data.max_input_seq_length
        if prompt_cap is None:
            return []
        budget = self.policy.max_total_sequence_length
        needed = prompt_cap + self.policy.generation.max_new_tokens
        if needed > budget:
            return [
                ConfigIssue(
                    "policy.max_total_sequence_length",
                    f"data.max_input_seq_length + policy.generation.max_new_tokens = {needed} "
                    f"exceeds it ({budget})",
                )
            ]
        return []


def _not_combined_with(setting: str, combined: dict[str, tuple[bool, str]]) -> list[ConfigIssue]:
    """One issue per key of ``combined`` that is on: ``{key: (on, why)}``."""
    return [
        ConfigIssue(key, f"not supported with {setting}: {reason}")
        for key, (on, reason) in combined.items()
        if on
    ]
