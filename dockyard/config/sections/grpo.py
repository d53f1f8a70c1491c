"""``grpo``: the RL loop (:class:`GRPOConfig`). Re-exported by :mod:`dockyard.algorithms.grpo`
(the spec's import path)."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from dockyard.config.base import Section
from dockyard.config.errors import ConfigIssue


class AdvEstimatorConfig(Section):
    """Advantage estimator; ``name`` is looked up in the estimator registry at launch.

    ``normalize_rewards`` / ``use_leave_one_out_baseline`` left at ``None`` inherit the
    grpo-level switches of the same name.
    """

    name: str = "grpo"
    normalize_rewards: bool | None = None
    use_leave_one_out_baseline: bool | None = None
    minus_baseline: bool = True
    reward_weights: dict[str, float] | None = Field(
        None, description="per-component weights (gdpo); None = equal weights"
    )


class RewardShapingConfig(Section):
    enabled: bool = False
    overlong_buffer_length: NonNegativeInt = 0
    overlong_buffer_penalty: float = Field(0.0, ge=0.0)
    max_response_length: PositiveInt | None = None
    stop_properly_penalty_coef: float | None = Field(None, ge=0.0, le=1.0)

    def rule_issues(self) -> list[ConfigIssue]:
        if not self.enabled:
            return []
        issues: list[ConfigIssue] = []
        overlong = self.overlong_buffer_length > 0
        if overlong and self.max_response_length is None:
            issues.append(
                ConfigIssue(
                    "max_response_length",
                    "the overlong-buffer penalty needs max_response_length",
                )
            )
        if (
            overlong
            and self.max_response_length is not None
            and self.overlong_buffer_length > self.max_response_length
        ):
            issues.append(
                ConfigIssue(
                    "overlong_buffer_length",
                    f"exceeds grpo.reward_shaping.max_response_length ({self.max_response_length})",
                )
            )
        if overlong and self.stop_properly_penalty_coef is not None:
            issues.append(
                ConfigIssue(
                    "stop_properly_penalty_coef",
                    "the stop-properly penalty and the overlong-buffer penalty both punish "
                    "length (as in the reference system, choose one): unset it or set "
                    "grpo.reward_shaping.overlong_buffer_length=0",
                )
            )
        if not overlong and self.stop_properly_penalty_coef is None:
            issues.append(
                ConfigIssue(
                    "enabled",
                    "reward shaping is enabled but configures nothing: set "
                    "grpo.reward_shaping.overlong_buffer_length (+ max_response_length, "
                    "overlong_buffer_penalty) or stop_properly_penalty_coef",
                )
            )
        return issues


class RewardScalingConfig(Section):
    """Clamp the reward to [source_min, source_max], then map it linearly onto
    [target_min, target_max]."""

    enabled: bool = False
    source_min: float = 0.0
    source_max: float = 1.0
    target_min: float = 0.0
    target_max: float = 1.0

    def rule_issues(self) -> list[ConfigIssue]:
        if self.source_min >= self.source_max:
            return [
                ConfigIssue(
                    "source_max",
                    f"must exceed source_min ({self.source_min}), got {self.source_max}",
                )
            ]
        return []


class AsyncGRPOConfig(Section):
    enabled: bool = False
    max_trajectory_age_steps: PositiveInt = Field(
        1, description="a group generated with weights g trains steps g+1 .. g+max_age"
    )
    max_generation_failures: NonNegativeInt = 0
    in_flight_weight_updates: bool = Field(
        False, description="refit while requests run (else drain first)"
    )
    recompute_kv_cache_after_weight_updates: bool = False

    def rule_issues(self) -> list[ConfigIssue]:
        if self.recompute_kv_cache_after_weight_updates and not self.in_flight_weight_updates:
            return [
                ConfigIssue(
                    "recompute_kv_cache_after_weight_updates",
                    "only applies with in_flight_weight_updates=true",
                )
            ]
        return []


#: What dockyard.environments.tools.calls parses (config imports no other dockyard package).
TOOL_CALL_FORMATS = ("hermes", "openai")


class StructuredToolUseConfig(Section):
    enabled: bool = False
    tool_call_format: str = Field(
        "hermes", description="hermes (<tool_call> JSON blocks) | openai (tool_calls message)"
    )
    max_tool_calls_per_turn: PositiveInt = 8
    describe_tools: bool = Field(
        True,
        description="each prompt of an environment with a toolbox describes its tools: the "
        "chat template's tools= (or a plain-text block without a template); off: the prompts "
        "say it themselves",
    )
    tool_services: list[str] = Field(
        default_factory=list,
        description="environments whose toolbox is reached as a tool service over the data "
        "plane (`dockyard tools serve --toolbox NAME`) instead of run in the rollout worker",
    )
    tool_service_prefix: str = Field(
        "dockyard.tools", description="subject prefix the tool services are served under"
    )
    tool_service_timeout_s: PositiveFloat = Field(
        60.0,
        description="a tool service request unanswered this long fails the episode; above "
        "the per-call tool timeout (30 s), so a slow tool is the model's timeout observation",
    )

    def rule_issues(self) -> list[ConfigIssue]:
        issues = []
        if self.tool_call_format not in TOOL_CALL_FORMATS:
            issues.append(
                ConfigIssue(
                    "tool_call_format",
                    f"must be one of {', '.join(TOOL_CALL_FORMATS)}, got {self.tool_call_format!r}",
                )
            )
        if self.tool_services and not self.enabled:
            issues.append(ConfigIssue("tool_services", "tools are called only with enabled=true"))
        repeated = sorted(
            {name for name in self.tool_services if self.tool_services.count(name) > 1}
        )
        if repeated:
            issues.append(ConfigIssue("tool_services", f"lists {', '.join(repeated)} twice"))
        # Both become tokens of the services' NATS subjects ({prefix}.{environment}.open).
        for name in sorted(set(self.tool_services)):
            if not _is_subject(name) or "." in name:
                issues.append(
                    ConfigIssue("tool_services", f"{name!r} cannot be a NATS subject token")
                )
        if not _is_subject(self.tool_service_prefix):
            issues.append(
                ConfigIssue(
                    "tool_service_prefix",
                    f"must be a NATS subject without wildcards, got {self.tool_service_prefix!r}",
                )
            )
        return issues


def _is_subject(text: str) -> bool:
    """A literal NATS subject: dot-separated non-empty tokens, no wildcard, no whitespace."""
    return all(
        token and not any(c in "*>" or c.isspace() for c in token) for token in text.split(".")
    )


class WorkerTrustConfig(Section):
    """Per-worker agreement of behaviour log-probs with the trainer's (``docs/trainer.md``,
    "Untrusted or broken workers")."""

    enabled: bool = Field(
        False,
        description="recompute every sample's log-probs under the trainer's weights before its "
        "step (one extra forward pass over the step's batch) and judge each rollout worker by "
        "how well its behaviour log-probs agree; a worker beyond a limit has its groups "
        "dead-lettered instead of trained",
    )
    max_token_mult_prob_error: float = Field(
        1.1,
        gt=1.0,
        description="flag a worker whose recent tokens' mean exp(|behaviour − trainer "
        "log-prob|) exceeds this (1 = perfect agreement; the loss's token_mult_prob_error)",
    )
    max_gen_kl: float = Field(
        0.02,
        gt=0.0,
        description="flag a worker whose recent tokens' mean k3 estimate of KL(π_behaviour ‖ "
        "π_trainer) exceeds this (nats per token; the loss's gen_kl_error)",
    )
    window_samples: PositiveInt = Field(
        64, description="a worker is judged on its most recent this many samples"
    )
    min_tokens: PositiveInt = Field(
        16,
        description="a worker is judged once its window holds this many tokens; its groups "
        "before that are trained",
    )


class GRPOConfig(Section):
    num_prompts_per_step: PositiveInt = 32
    num_generations_per_prompt: PositiveInt = 16
    max_num_epochs: PositiveInt = 1
    max_num_steps: PositiveInt = 1_000_000
    max_rollout_turns: PositiveInt = 1
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True
    advantage_clip_low: float | None = None
    advantage_clip_high: float | None = None
    adv_estimator: AdvEstimatorConfig = Field(default_factory=AdvEstimatorConfig)
    val_period: NonNegativeInt = Field(10, description="0 disables periodic validation")
    val_at_start: bool = False
    val_at_end: bool = False
    val_batch_size: PositiveInt | None = None
    max_val_samples: PositiveInt | None = None
    seed: int = 42
    overlong_filtering: bool = False
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: PositiveInt = 10
    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig)
    reward_scaling: RewardScalingConfig = Field(default_factory=RewardScalingConfig)
    invalid_action_penalty: float | None = Field(
        None, description="reward assigned to a sample flagged as an invalid action"
    )
    invalid_tool_call_advantage: float | None = None
    malformed_thinking_advantage: float | None = None
    seq_logprob_error_threshold: float | None = Field(None, gt=0.0)
    structured_tool_use: StructuredToolUseConfig = Field(default_factory=StructuredToolUseConfig)
    async_grpo: AsyncGRPOConfig = Field(default_factory=AsyncGRPOConfig)
    worker_trust: WorkerTrustConfig = Field(default_factory=WorkerTrustConfig)

    def rule_issues(self) -> list[ConfigIssue]:
        issues = []
        low, high = self.advantage_clip_low, self.advantage_clip_high
        if low is not None and high is not None and low >= high:
            issues.append(
                ConfigIssue("advantage_clip_low", f"must be below advantage_clip_high ({high})")
            )
        return issues
