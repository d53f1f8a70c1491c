"""``policy``: the trained model, its parallelism backend, optimizer and generation engine."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, PositiveInt

from dockyard.config.base import Section, check_finite
from dockyard.config.errors import ConfigIssue

Precision = Literal["float32", "bfloat16", "float16"]


class TokenizerConfig(Section):
    name: str | None = Field(None, description="HF tokenizer name or directory; None = model_name")
    chat_template: str | None = None


class LoRAConfig(Section):
    enabled: bool = False
    rank: PositiveInt = 8
    alpha: float = 16.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


class DTensorConfig(Section):
    """PyTorch DTensor/FSDP2 trainer backend (the default)."""

    enabled: bool = True
    cpu_offload: bool = False
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    tensor_parallel_size: PositiveInt = 1
    context_parallel_size: PositiveInt = 1
    expert_parallel_size: PositiveInt = 1
    lora_cfg: LoRAConfig = Field(default_factory=LoRAConfig)


class MegatronConfig(Section):
    """Megatron-Core trainer backend."""

    enabled: bool = False
    tensor_model_parallel_size: PositiveInt = 1
    pipeline_model_parallel_size: PositiveInt = 1
    context_parallel_size: PositiveInt = 1
    expert_model_parallel_size: PositiveInt = 1
    sequence_parallel: bool = False


class JaxConfig(Section):
    """JAX (Flax NNX) trainer backend."""

    enabled: bool = False
    data_parallel_size: PositiveInt = 1
    tensor_parallel_size: PositiveInt = 1


class OptimizerConfig(Section):
    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(1e-6, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)

    def rule_issues(self) -> list[ConfigIssue]:
        return check_finite(self.lr, "lr", "set a positive learning rate such as 1e-6")


class SchedulerConfig(Section):
    name: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    total_steps: PositiveInt | None = Field(None, description="None = grpo.max_num_steps")


class SequencePackingConfig(Section):
    enabled: bool = False
    train_mb_tokens: PositiveInt | None = None
    logprob_mb_tokens: PositiveInt | None = None
    algorithm: Literal["modified_first_fit_decreasing", "first_fit_decreasing"] = (
        "modified_first_fit_decreasing"
    )


class DynamicBatchingConfig(Section):
    enabled: bool = False
    train_mb_tokens: PositiveInt | None = None
    logprob_mb_tokens: PositiveInt | None = None
    sequence_length_round: PositiveInt = 64


class VllmConfig(Section):
    """Inference-side settings of the vLLM backend (independent of the trainer's parallelism)."""

    mode: Literal["inprocess", "server"] = "inprocess"
    server_urls: list[str] = Field(default_factory=list, description="for mode=server")
    precision: Literal["bfloat16", "float16", "float32", "fp8"] = "bfloat16"
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    expert_parallel_size: PositiveInt = 1
    gpu_memory_utilization: float = Field(0.6, gt=0.0, le=1.0)
    max_model_len: PositiveInt | None = None
    enforce_eager: bool = False
    env_vars: dict[str, str] = Field(
        default_factory=dict, description="environment variables passed to the vLLM processes"
    )

    def rule_issues(self) -> list[ConfigIssue]:
        if self.mode == "server" and not self.server_urls:
            return [ConfigIssue("server_urls", "mode=server needs at least one server URL")]
        return []


class SglangConfig(Section):
    server_urls: list[str] = Field(default_factory=list)
    request_timeout_s: float = Field(600.0, gt=0.0)


class ColocatedConfig(Section):
    enabled: bool = False


class GenerationConfig(Section):
    backend: Literal["torch", "vllm", "sglang"] = "torch"
    max_new_tokens: PositiveInt = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = Field(None, description="None or -1 disables top-k")
    stop_strings: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    colocated: ColocatedConfig = Field(default_factory=ColocatedConfig)
    vllm_cfg: VllmConfig = Field(default_factory=VllmConfig)
    sglang_cfg: SglangConfig = Field(default_factory=SglangConfig)
    allow_multimodal_inputs: bool = False
    max_image_pixels: PositiveInt = Field(
        89_478_485, description="decoded-size cap for one image (decompression-bomb guard)"
    )
    max_images_per_sample: PositiveInt = 8
    inflight_refit_policy: Literal["finish_on_old", "continue_on_new"] = Field(
        "finish_on_old",
        description=(
            "a refit arriving while requests are being decoded: finish them on the old weights, "
            "or switch to the new weights between decode steps (torch backend only); every "
            "token records the weight version that produced it either way"
        ),
    )

    def rule_issues(self) -> list[ConfigIssue]:
        issues = sampling_parameter_issues(self.temperature, self.top_p, self.top_k)
        if self.inflight_refit_policy == "continue_on_new" and self.backend != "torch":
            issues.append(
                ConfigIssue(
                    "inflight_refit_policy",
                    f"continue_on_new needs backend=torch (the {self.backend} backend cannot "
                    "report which tokens came from which weights); use finish_on_old",
                )
            )
        if self.vllm_cfg.precision == "fp8" and self.backend != "vllm":
            issues.append(ConfigIssue("vllm_cfg.precision", "fp8 serving needs backend=vllm"))
        if self.backend == "sglang" and not self.sglang_cfg.server_urls:
            # dockyard drives SGLang servers over HTTP; it does not start them.
            issues.append(
                ConfigIssue(
                    "sglang_cfg.server_urls", "backend=sglang needs at least one server URL"
                )
            )
        return issues


def sampling_parameter_issues(
    temperature: float, top_p: float, top_k: int | None
) -> list[ConfigIssue]:
    """Finiteness and range checks shared by launch-time validation and a rollout worker's
    start-up check: a NaN/inf or out-of-range value is refused, never forwarded to an engine."""
    issues = check_finite(temperature, "temperature", "use e.g. 1.0")
    issues += check_finite(top_p, "top_p", "use a value in (0, 1]")
    if math.isfinite(temperature) and temperature < 0:
        issues.append(ConfigIssue("temperature", f"must be >= 0 (0 = greedy), got {temperature}"))
    if math.isfinite(top_p) and not 0.0 < top_p <= 1.0:
        issues.append(ConfigIssue("top_p", f"must be in (0, 1], got {top_p}"))
    if top_k is not None and top_k != -1 and top_k < 1:
        issues.append(ConfigIssue("top_k", f"must be >= 1, or -1/null to disable, got {top_k}"))
    return issues


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class PolicyConfig(Section):
    model_name: str
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    train_global_batch_size: PositiveInt = 512
    train_micro_batch_size: PositiveInt = 4
    generation_batch_size: PositiveInt = 32
    logprob_batch_size: PositiveInt = 8
    max_total_sequence_length: PositiveInt = 1024
    precision: Precision = "bfloat16"
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    skip_prev_logprobs: bool = Field(
        False,
        description="skip recomputing π_old log-probs (zeros are used); only for on-policy runs",
    )
    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    megatron_cfg: MegatronConfig = Field(default_factory=MegatronConfig)
    jax_cfg: JaxConfig = Field(default_factory=JaxConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)

    def rule_issues(self) -> list[ConfigIssue]:
        issues: list[ConfigIssue] = []
        backends = [
            name
            for name, enabled in (
                ("dtensor_cfg", self.dtensor_cfg.enabled),
                ("megatron_cfg", self.megatron_cfg.enabled),
                ("jax_cfg", self.jax_cfg.enabled),
            )
            if enabled
        ]
        if len(backends) > 1:
            issues.append(
                ConfigIssue(
                    f"{backends[1]}.enabled",
                    f"only one trainer backend may be enabled, found {', '.join(backends)}; "
                    "set the others' enabled=false",
                )
            )
        if self.sequence_packing.enabled and self.dynamic_batching.enabled:
            issues.append(
                ConfigIssue(
                    "sequence_packing.enabled",
                    "sequence packing and dynamic batching are exclusive; disable one",
                )
            )
        fixed_micro_batches = not (self.sequence_packing.enabled or self.dynamic_batching.enabled)
        if fixed_micro_batches and self.train_global_batch_size % self.train_micro_batch_size:
            issues.append(
                ConfigIssue(
                    "train_micro_batch_size",
                    f"must divide train_global_batch_size ({self.train_global_batch_size}), "
                    f"got {self.train_micro_batch_size}",
                )
            )
        issues += self._token_budget_issues()
        if self.generation.max_new_tokens > self.max_total_sequence_length:
            issues.append(
                ConfigIssue(
                    "generation.max_new_tokens",
                    f"{self.generation.max_new_tokens} exceeds max_total_sequence_length "
                    f"({self.max_total_sequence_length})",
                )
            )
        return issues

    def token_budget(self, train: bool) -> int:
        """Tokens per micro-batch under the enabled ``sequence_packing`` or
        ``dynamic_batching``: its ``train_mb_tokens`` (``train``) or ``logprob_mb_tokens``;
        unset, as many as a fixed micro-batch holds at ``max_total_sequence_length`` (the same
        peak memory)."""
        section = self.sequence_packing if self.sequence_packing.enabled else self.dynamic_batching
        budget = section.train_mb_tokens if train else section.logprob_mb_tokens
        size = self.train_micro_batch_size if train else self.logprob_batch_size
        return budget or size * self.max_total_sequence_length

    def _token_budget_issues(self) -> list[ConfigIssue]:
        """A token budget must hold the longest sequence allowed (rounded up, for dynamic
        batching): a longer one could only be trained by cutting it, which changes the loss."""
        if self.sequence_packing.enabled:
            section, longest, rounded = "sequence_packing", self.max_total_sequence_length, ""
        elif self.dynamic_batching.enabled:
            section, rounded = "dynamic_batching", ", rounded up to sequence_length_round"
            longest = _round_up(
                self.max_total_sequence_length, self.dynamic_batching.sequence_length_round
            )
        else:
            return []
        issues: list[ConfigIssue] = []
        for name, size, train in (
            ("train_mb_tokens", "train_micro_batch_size", True),
            ("logprob_mb_tokens", "logprob_batch_size", False),
        ):
            budget = self.token_budget(train)
            if budget >= longest:
                continue
            given = getattr(getattr(self, section), name) is not None
            what = (
                f"{budget} tokens"
                if given
                else f"unset, so {size} × max_total_sequence_length = {budget} tokens,"
            )
            issues.append(
                ConfigIssue(
                    f"{section}.{name}",
                    f"{what} cannot hold one sequence of "
                    f"max_total_sequence_length ({longest} tokens{rounded}); set it to at least "
                    f"{longest} or lower max_total_sequence_length",
                )
            )
        return issues
