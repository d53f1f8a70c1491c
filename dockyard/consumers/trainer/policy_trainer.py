"""One GRPO optimizer step on an assembled batch.

π_old (``prev_logprobs``) is recomputed here with the weights as they are at the start of the
step, before any update; the behaviour log-probs the engine reported enter only the
importance-sampling weight. When the engine samples with temperature ``T``, the trainer scores
tokens under the same tempered distribution (``log_softmax(logits / T)``), so both sides of the
ratio describe one distribution.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from dockyard.algorithms.advantages import AdvantageInputs, build_estimator
from dockyard.algorithms.advantages.pipeline import AdvantageOverrides, compute_advantages
from dockyard.algorithms.grpo import MasterConfig
from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts, LossInputs
from dockyard.algorithms.loss_metrics import LossMetrics, merge_loss_metrics
from dockyard.algorithms.masked import per_sequence_mean
from dockyard.algorithms.rewards import overlong_filter, prepare_rewards
from dockyard.config.capabilities import LORA_DROPOUT_WITH_TENSOR_PARALLEL
from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.context_parallel import (
    CP,
    context_parallel_logprobs,
    enable_context_parallel,
    loss_share,
)
from dockyard.consumers.trainer.data_parallel import (
    broadcast_from_first_rank,
    global_counts,
    gradient_scale,
    pad_plans,
    shard_policy,
)
from dockyard.consumers.trainer.expert_parallel import (
    EP,
    REPLICAS,
    finish_expert_gradients,
    shard_experts,
)
from dockyard.consumers.trainer.micro_batches import (
    MicroBatch,
    has_varlen_attention,
    micro_token_logprobs,
    next_token_logprobs,
    plan_micro_batches,
)
from dockyard.consumers.trainer.optim import build_optimizer, build_scheduler
from dockyard.consumers.trainer.tensor_parallel import (
    DP,
    TP,
    clip_mixed_gradients,
    parallelize_policy,
)
from dockyard.consumers.trainer.vision_batches import with_images
from dockyard.models.devices import compute_precision, grad_scaler, training_device
from dockyard.models.lora import (
    PeftCheckpoint,
    adapter_from_state,
    apply_lora,
    lora_scalings,
    merged_from_state,
    peft_state,
)
from dockyard.models.vision import VisionProcessor
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: The whole tensors of a sharded model or optimizer, gathered to rank 0's CPU (empty elsewhere).
_GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)
#: Whole tensors held by rank 0, sharded out to every rank.
_FROM_FIRST_RANK = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
_ADAPTER_FROM_FIRST_RANK = StateDictOptions(
    full_state_dict=True, broadcast_from_rank0=True, strict=False
)


def token_logprobs(
    model: torch.nn.Module, batch: TrainingBatch, temperature: float = 1.0
) -> torch.Tensor:
    """``[B, L-1]`` log-probs of each next token under ``model`` (grad follows the caller)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return next_token_logprobs(logits, batch.input_ids, temperature)


@dataclass(frozen=True)
class StepOutcome:
    loss: LossMetrics
    grad_norm: float
    learning_rate: float
    advantage_mean: float
    advantage_abs_mean: float
    seconds: float
    filtered_fraction: float = 0.0  # samples removed by overlong / log-prob-error filters
    advantage_tokens: int = 0  # the valid tokens the advantage means are taken over
    images: int = 0  # images the step's forward passes fed the vision tower
    #: The gradient was not finite, so the optimizer step was not applied (weights unchanged).
    skipped_nonfinite_grad: bool = False

    def as_metrics(self) -> dict[str, float]:
        metrics = {f"loss/{name}": value for name, value in self.loss.as_dict().items()}
        metrics.update(
            {
                "train/grad_norm": self.grad_norm,
                "train/learning_rate": self.learning_rate,
                "train/advantage_mean": self.advantage_mean,
                "train/advantage_abs_mean": self.advantage_abs_mean,
                "train/filtered_sample_fraction": self.filtered_fraction,
                "train/images": float(self.images),
                "train/skipped_nonfinite_grad": float(self.skipped_nonfinite_grad),
                "timing/train_step_s": self.seconds,
            }
        )
        return metrics


@dataclass(frozen=True)
class Gradients:
    """What :meth:`PolicyTrainer.gradients` computed besides the gradients themselves."""

    loss: LossMetrics
    prev_logprobs: torch.Tensor  # [B, L-1]
    advantages: torch.Tensor  # [B, L-1]
    token_mask: torch.Tensor  # [B, L-1]
    filtered_fraction: float


class PolicyTrainer:
    """Holds the policy, its optimizer and schedule, the loss and the advantage estimator."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: MasterConfig,
        device: torch.device | None = None,
        *,
        mesh: DeviceMesh | None = None,
        processor: VisionProcessor | None = None,
    ) -> None:
        """``processor``: a vision-language policy's (its samples' images reach every forward
        pass, see :mod:`~dockyard.consumers.trainer.vision_batches`).

        ``mesh``: the ranks' device mesh (under ``torchrun``): 1-D, data parallel; or 2-D
        ``("dp", "tp")``, tensor parallel within each data-parallel group
        (:mod:`~dockyard.consumers.trainer.tensor_parallel`). Over ``dp`` the policy is sharded
        with FSDP2 and each rank trains on its share of the batch (see
        :mod:`~dockyard.consumers.trainer.data_parallel`)."""
        self.config = config
        policy = config.policy
        self.processor = processor
        self.device = device if device is not None else training_device()
        # Master weights in float32 on the training device (moved in place: the caller's model
        # is the trained one); policy.precision applies to the math, see dockyard.models.devices.
        self.model = model.to(device=self.device, dtype=torch.float32).train()
        if mesh is not None:
            broadcast_from_first_rank(self.model)
        # Names that share another's parameter (tied embeddings): one tensor, as in the model.
        self.tied = tied_names(self.model)
        self.scaler = grad_scaler(self.device, policy.precision)
        self.loss = ClippedPGLoss(config.loss_fn)
        self.estimator = build_estimator(config.grpo, config.loss_fn)
        self.temperature = policy.generation.temperature
        # A frozen copy of the initial policy; only when some KL term needs it. Copied before
        # sharding: it stays whole on every rank and needs no collectives.
        needs_reference = config.loss_fn.reference_policy_kl_penalty > 0
        self.reference: torch.nn.Module | None = (
            copy.deepcopy(model).eval().requires_grad_(False) if needs_reference else None
        )
        # LoRA (after the reference copy: the reference is the base model): only the adapters
        # train; self.model stays the same object and its forward goes through them.
        lora = policy.dtensor_cfg.lora_cfg
        self.peft = apply_lora(self.model, lora) if lora.enabled else None
        self.lora_scalings = lora_scalings(self.model) if self.peft is not None else {}
        if self.peft is not None and mesh is not None:
            broadcast_from_first_rank(self.model, containing=".lora_")
        #: Under LoRA, the adapter's whole tensors as of the last :meth:`model_state` (PEFT's
        #: names): what a checkpoint writes in PEFT's format (see :meth:`adapter_checkpoint`).
        self.adapter_snapshot: dict[str, torch.Tensor] = {}
        dtensor = policy.dtensor_cfg
        if self.peft is not None and dtensor.tensor_parallel_size > 1 and lora.dropout > 0:
            raise ValueError(LORA_DROPOUT_WITH_TENSOR_PARALLEL)
        if dtensor.activation_checkpointing:
            # Each decoder layer keeps only its input; its activations are recomputed in
            # backward. Non-reentrant: works with frozen base weights (LoRA) and FSDP2.
            self.model.gradient_checkpointing_enable(  # type: ignore[operator]  # a transformers method; torch types unknown attributes as Tensor | Module
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.mesh = mesh
        names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
        self.tensor_mesh = mesh[TP] if mesh is not None and TP in names else None
        #: The context-parallel ranks (one data-parallel group's), see :mod:`.context_parallel`.
        self.context_mesh = mesh[CP] if mesh is not None and CP in names else None
        #: The expert-parallel ranks (each its share of every MoE layer's experts) and the ranks
        #: holding replicas of the same experts, see :mod:`.expert_parallel`.
        self.expert_mesh = mesh[EP] if mesh is not None and EP in names else None
        self.expert_replicas = (
            _larger_than_one(mesh[REPLICAS]) if mesh is not None and EP in names else None
        )
        #: The ranks FSDP2 shards over (None: not sharded by FSDP2), and those holding different
        #: shares of the batch (their counts add up), see :func:`_sharding_meshes`.
        self.data_mesh, self.batch_mesh = _sharding_meshes(
            mesh,
            tensor=self.tensor_mesh is not None,
            context=self.context_mesh is not None,
            expert=self.expert_mesh is not None,
        )
        context_ranks = self.context_mesh.size() if self.context_mesh is not None else 1
        if dtensor.context_parallel_size != context_ranks:
            raise ValueError(
                f"policy.dtensor_cfg.context_parallel_size={dtensor.context_parallel_size} but the "
                f"mesh has {context_ranks} context-parallel rank(s)"
            )
        if self.context_mesh is not None:
            enable_context_parallel(self.model, self.context_mesh.get_group())
        tensor_ranks = self.tensor_mesh.size() if self.tensor_mesh is not None else 1
        if dtensor.tensor_parallel_size != tensor_ranks:
            raise ValueError(
                f"policy.dtensor_cfg.tensor_parallel_size={dtensor.tensor_parallel_size} but the "
                f"mesh has {tensor_ranks} tensor-parallel rank(s)"
            )
        expert_ranks = self.expert_mesh.size() if self.expert_mesh is not None else 1
        if dtensor.expert_parallel_size != expert_ranks:
            raise ValueError(
                f"policy.dtensor_cfg.expert_parallel_size={dtensor.expert_parallel_size} but the "
                f"mesh has {expert_ranks} expert-parallel rank(s)"
            )
        # After the reference copy (it keeps every expert) and LoRA (refused with EP).
        self.expert_parameters = (
            shard_experts(self.model, self.expert_mesh) if self.expert_mesh is not None else []
        )
        if dtensor.cpu_offload and self.data_mesh is None:
            raise ValueError(
                "policy.dtensor_cfg.cpu_offload offloads FSDP2 shards: it needs data-parallel "
                "ranks (a mesh)"
            )
        self.varlen = has_varlen_attention(self.model)
        if self.tensor_mesh is not None:
            parallelize_policy(
                self.model, self.tensor_mesh, sequence_parallel=dtensor.sequence_parallel
            )
        if self.data_mesh is not None:
            shard_policy(
                self.model,
                self.data_mesh,
                cpu_offload=dtensor.cpu_offload,
                ignored=set(self.expert_parameters) or None,
            )
        # After sharding: the optimizer holds (and its state follows) the sharded parameters.
        self.optimizer = build_optimizer(self.model, policy.optimizer)
        self.scheduler = build_scheduler(
            self.optimizer, policy.scheduler, config.grpo.max_num_steps
        )
        log.info(
            "trainer.placement",
            device=str(self.device),
            precision=policy.precision,
            master_weights="float32",
            data_parallel_ranks=self.batch_mesh.size() if self.batch_mesh is not None else 1,
            tensor_parallel_ranks=self.tensor_mesh.size() if self.tensor_mesh is not None else 1,
            context_parallel_ranks=context_ranks,
            expert_parallel_ranks=expert_ranks,
            sequence_parallel=dtensor.sequence_parallel and self.tensor_mesh is not None,
            lora_rank=lora.rank if self.peft is not None else None,
            activation_checkpointing=dtensor.activation_checkpointing,
            cpu_offload=dtensor.cpu_offload,
            trained_parameters=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            varlen_attention=self.varlen,
        )

    def passes(
        self, model: torch.nn.Module, batch: TrainingBatch, purpose: str
    ) -> list[MicroBatch | None]:
        """:meth:`plan`, and for the sharded policy, ``None`` (a zero-weight pass on the first
        micro-batch) until every rank runs as many passes (FSDP2's collectives must match)."""
        plans = self.plan(batch, purpose)
        if self.data_mesh is None or model is not self.model:
            return list(plans)
        return pad_plans(plans, self.device, self.data_mesh)

    def plan(self, batch: TrainingBatch, purpose: str) -> list[MicroBatch]:
        """The forward passes of ``purpose`` (``"train"`` / ``"logprob"``), see
        :mod:`~dockyard.consumers.trainer.micro_batches`."""
        plans = plan_micro_batches(batch, self.config.policy, purpose, varlen=self.varlen)
        if batch.images is None:
            return plans
        if self.processor is None:
            raise ValueError(
                "the batch carries images but the policy has no image processor (it is not a "
                "vision-language model): training them as text would be silently wrong"
            )
        if self.context_mesh is not None:
            raise ValueError("context parallelism cannot carry images (it splits the sequence)")
        limit = self.config.policy.generation.max_image_pixels
        return [with_images(micro, batch, self.processor, max_pixels=limit) for micro in plans]

    def forward_logprobs(self, model: torch.nn.Module, micro: MicroBatch) -> torch.Tensor:
        """``[n, columns]`` log-probs of ``micro`` under ``model`` in ``policy.precision``."""
        with compute_precision(self.device, self.config.policy.precision):
            group = self._context_group
            if group is not None and model is self.model:  # the reference stays whole
                return context_parallel_logprobs(model, micro, group, self.temperature)
            return micro_token_logprobs(model, micro, self.temperature)

    @property
    def _context_group(self) -> dist.ProcessGroup | None:
        return self.context_mesh.get_group() if self.context_mesh is not None else None

    @torch.no_grad()
    def batch_logprobs(self, model: torch.nn.Module, batch: TrainingBatch) -> torch.Tensor:
        """``[B, L-1]`` next-token log-probs of every sample (0 past a sample's last target),
        on the training device."""
        out = torch.zeros(batch.token_mask.shape, dtype=torch.float32, device=self.device)
        plans = self.passes(model, batch, "logprob")
        for micro in plans:
            if micro is None:  # only to match the other ranks' collectives
                first = plans[0]
                assert first is not None  # every rank has at least one group
                self.forward_logprobs(model, first)
                continue
            out[micro.indices, : micro.columns] = self.forward_logprobs(model, micro)
        return out

    def rewards(self, batch: TrainingBatch) -> torch.Tensor:
        """Scaling, shaping and the invalid-action penalty, as configured."""
        return prepare_rewards(
            batch.rewards,
            self.config.grpo,
            response_lengths=batch.response_lengths,
            truncated=batch.truncated,
            invalid_action=batch.invalid_action,
        )

    def advantages(
        self, batch: TrainingBatch, prev: torch.Tensor, reference: torch.Tensor | None
    ) -> torch.Tensor:
        inputs = AdvantageInputs(
            rewards=self.rewards(batch),
            group_ids=list(batch.group_ids),
            token_mask=batch.token_mask,
            valid_mask=batch.sample_mask,
            teacher_logprobs=batch.teacher_logprobs,
            prev_logprobs=prev,
            reference_logprobs=reference,
        )
        overrides = AdvantageOverrides(batch.invalid_tool_call, batch.malformed_thinking)
        return compute_advantages(
            self.estimator, inputs, self.config.grpo, self.config.loss_fn, overrides
        )

    def filter_samples(
        self, batch: TrainingBatch, prev: torch.Tensor
    ) -> tuple[TrainingBatch, float]:
        """Samples that leave the loss: truncated ones (``grpo.overlong_filtering``) and those
        whose engine log-probs disagree with π_old beyond ``grpo.seq_logprob_error_threshold``
        (``exp(mean_t |gen − prev|)``, the per-sequence multiplicative probability error)."""
        grpo = self.config.grpo
        mask = batch.sample_mask
        if grpo.overlong_filtering:
            mask = overlong_filter(mask, batch.truncated)
        if grpo.seq_logprob_error_threshold is not None:
            error = torch.exp(
                per_sequence_mean((batch.generation_logprobs - prev).abs(), batch.token_mask)
            )
            mask = mask * (error <= grpo.seq_logprob_error_threshold).to(mask.dtype)
        removed = float((batch.sample_mask - mask).sum()) / max(batch.size, 1)
        return dataclasses.replace(batch, sample_mask=mask), removed

    def accumulate_gradients(
        self,
        batch: TrainingBatch,
        prev: torch.Tensor,
        advantages: torch.Tensor,
        reference: torch.Tensor | None,
        counts: GlobalCounts,
    ) -> list[LossMetrics]:
        """Backward of the loss over every training micro-batch (gradients add up in ``.grad``;
        each micro-batch's loss is its share of the full-batch loss, see :class:`GlobalCounts`)."""
        parts: list[LossMetrics] = []
        plans = self.passes(self.model, batch, "train")
        for micro in plans:
            if micro is None:  # a zero-weight pass, only to match the other ranks' collectives
                first = plans[0]
                assert first is not None  # every rank has at least one group
                self.forward_logprobs(self.model, first).sum().mul(0.0).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
                continue
            rows, columns = micro.indices, micro.columns
            part = batch.take(rows, columns)
            inputs = LossInputs(
                logprobs=self.forward_logprobs(self.model, micro),
                prev_logprobs=prev[rows, :columns],
                generation_logprobs=part.generation_logprobs,
                advantages=advantages[rows, :columns],
                token_mask=part.token_mask,
                sample_mask=part.sample_mask,
                reference_logprobs=reference[rows, :columns] if reference is not None else None,
                rewards=part.rewards,
            )
            loss, metrics = self.loss(inputs, counts)
            scale = gradient_scale(self.data_mesh) * loss_share(self._context_group)
            self.scaler.scale(loss * scale).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            parts.append(metrics)
        return parts

    def gradients(self, batch: TrainingBatch) -> Gradients:
        """π_old, the reference, advantages, then the loss's gradients in ``.grad`` (zeroed
        first; times the float16 loss scale, if any); the parameters are not changed."""
        batch = batch.to(self.device)
        self.model.eval()  # π_old and the reference without dropout
        prev = (
            torch.zeros_like(batch.generation_logprobs)
            if self.config.policy.skip_prev_logprobs
            else self.batch_logprobs(self.model, batch)
        )
        reference = self.batch_logprobs(self.reference, batch) if self.reference else None
        batch, masked_fraction = self.filter_samples(batch, prev)
        advantages = self.advantages(batch, prev, reference)
        counts = GlobalCounts.from_batch(batch.token_mask, batch.sample_mask, batch.rewards)
        if self.batch_mesh is not None:
            counts = global_counts(counts, self.device, self.batch_mesh)

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts = self.accumulate_gradients(batch, prev, advantages, reference, counts)
        if self.expert_parameters:
            replicas = self.expert_replicas.get_group() if self.expert_replicas else None
            finish_expert_gradients(
                self.expert_parameters, int(gradient_scale(self.data_mesh)), replicas
            )
        return Gradients(
            loss=merge_loss_metrics(parts),
            prev_logprobs=prev,
            advantages=advantages,
            token_mask=batch.token_mask,
            filtered_fraction=masked_fraction,
        )

    def step(self, batch: TrainingBatch) -> StepOutcome:
        started = time.perf_counter()
        result = self.gradients(batch)
        self.scaler.unscale_(self.optimizer)
        max_norm = self.config.policy.max_grad_norm
        if self.tensor_mesh is not None or self.expert_parameters:  # DTensors on two meshes
            grad_norm = clip_mixed_gradients(self.model.parameters(), max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), max_norm if max_norm is not None else float("inf")
            )
        if isinstance(grad_norm, DTensor):  # sharded gradients: the norm of the whole
            grad_norm = grad_norm.full_tensor()
        # The norm is the whole gradient's (every rank holds the same value), so every rank
        # takes the same decision. A non-finite gradient is never applied: AdamW would write
        # NaN into every weight, and every rollout worker would load them.
        applied = bool(torch.isfinite(grad_norm))
        if applied:
            # With float16 loss scaling, a step whose gradients overflowed is skipped and the
            # scale lowered; otherwise this is optimizer.step().
            self.scaler.step(self.optimizer)
        else:
            log.warning(
                "trainer.nonfinite_gradient_skipped",
                grad_norm=float(grad_norm),
                loss=result.loss.loss,
                loss_scale=self.scaler.get_scale() if self.scaler.is_enabled() else None,
                reason="the optimizer step is not applied; the weights stay as they were",
            )
            self.optimizer.zero_grad(set_to_none=True)
        # Lowers the float16 loss scale after an overflow (unscale_ recorded it); else a no-op.
        self.scaler.update()
        learning_rate = self.optimizer.param_groups[0]["lr"]
        self.scheduler.step()
        advantages, valid = result.advantages, result.token_mask.bool()
        return StepOutcome(
            loss=result.loss,
            grad_norm=float(grad_norm),
            learning_rate=float(learning_rate),
            advantage_mean=float(advantages[valid].mean()) if valid.any() else 0.0,
            advantage_abs_mean=float(advantages[valid].abs().mean()) if valid.any() else 0.0,
            filtered_fraction=result.filtered_fraction,
            seconds=time.perf_counter() - started,
            advantage_tokens=int(valid.sum()),
            images=sum(map(len, batch.images)) if batch.images is not None else 0,
            skipped_nonfinite_grad=not applied,
        )

    # -- whole state, sharded or not -----------------------------------------------------------
    # With a mesh each of these is a collective: every rank calls it (see ranks.py).
    def model_state(self) -> dict[str, torch.Tensor]:
        """The whole model's weights by name: the parameters themselves in one process; when
        sharded, gathered to rank 0's CPU (empty on the other ranks). Tied names share one
        tensor either way, so both serialise alike. Under LoRA: the adapters merged, under the
        model's own names (what checkpoints and exports hold)."""
        state = self._whole_state()
        if self.peft is None or not state:
            return state
        self.adapter_snapshot = peft_state(state)
        return merged_from_state(state, self.lora_scalings)

    def _whole_state(self) -> dict[str, torch.Tensor]:
        if self.mesh is None:
            return self.model.state_dict()
        # Model weights only: every value is a tensor (the ValueType union covers optimizers').
        state = cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=_GATHERED))
        for name, owner in self.tied.items():
            if owner in state:
                state[name] = state[owner]
        return state

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What a weight event carries: the adapter alone under LoRA
        (:func:`~dockyard.models.lora.adapter_from_state`), else :meth:`model_state`. Sharded
        under LoRA, only the adapter's parameters are gathered (a collective: every rank calls
        it), the same whole tensors on every rank."""
        if self.peft is None:
            return self.model_state()
        adapter = {
            name: whole_tensor(parameter)
            for name, parameter in self.model.named_parameters()
            if ".lora_" in name
        }
        return adapter_from_state(adapter, self.lora_scalings)

    def adapter_checkpoint(self) -> PeftCheckpoint | None:
        """Under LoRA, what a checkpoint writes in PEFT's format: the model, and when sharded
        the whole adapter gathered by the last :meth:`model_state` (a rank writing alone cannot
        gather DTensors)."""
        if self.peft is None:
            return None
        return PeftCheckpoint(self.peft, self.adapter_snapshot if self.mesh is not None else None)

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Sharded: rank 0's whole weights (tied duplicates may be absent) out to every rank;
        the other ranks pass ``{}``. Strict: a name missing or unexpected is refused."""
        assert self.mesh is not None, "one process loads with trainer_checkpoint.load_weights"
        if self.peft is not None:
            # The base is model_name's on every rank: the adapter alone (checked whole by
            # lora.adapter_tensors), so the base's names are absent by design.
            set_model_state_dict(self.model, dict(state), options=_ADAPTER_FROM_FIRST_RANK)
            return
        if state:
            state = {**{n: state[o] for n, o in self.tied.items() if o in state}, **state}
        set_model_state_dict(self.model, dict(state), options=_FROM_FIRST_RANK)

    def state_dict(self) -> dict[str, object]:
        """Optimizer (by parameter name, whole tensors: the same in one process and sharded),
        scheduler and loss-scaler state. Sharded: a collective; the optimizer state is rank 0's
        only."""
        options = _GATHERED if self.mesh is not None else None
        return {
            "optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=options),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """What :meth:`state_dict` returned; sharded, the other ranks pass an empty
        ``optimizer`` (rank 0's is broadcast) with the same scheduler and scaler state."""
        optimizer = state["optimizer"]
        assert isinstance(optimizer, dict)
        configured = self._configured_hyperparameters()
        if by_index(optimizer):  # checkpoints written before optimizer state was keyed by name
            if self.mesh is not None:
                raise ValueError(
                    "this checkpoint's optimizer state is keyed by parameter index: resume it in "
                    "one process once (its next checkpoint keys it by name), then sharded"
                )
            self.optimizer.load_state_dict(optimizer)
        else:
            options = _FROM_FIRST_RANK if self.mesh is not None else None
            set_optimizer_state_dict(self.model, self.optimizer, optimizer, options=options)
        self.scheduler.load_state_dict(state["scheduler"])  # type: ignore[arg-type]  # the state this trainer's state_dict wrote
        if "grad_scaler" in state:  # checkpoints from before float16 loss scaling have none
            self.scaler.load_state_dict(state["grad_scaler"])  # type: ignore[arg-type]  # the state this trainer's state_dict wrote
        self._apply_hyperparameters(*configured)

    def _configured_hyperparameters(
        self,
    ) -> tuple[list[dict[str, object]], list[float | torch.Tensor]]:
        """Each param group's settings (lr, betas, weight decay, ...) and the schedule's base
        rates as the config built them, before a checkpoint's state replaces them."""
        groups = [
            {k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups
        ]
        return groups, list(self.scheduler.base_lrs)

    def _apply_hyperparameters(
        self, groups: list[dict[str, object]], base_lrs: list[float | torch.Tensor]
    ) -> None:
        """The config's optimizer and schedule settings over a loaded checkpoint's: loading an
        optimizer's state restores its param groups' settings and the scheduler's base rates,
        which would quietly undo ``policy.optimizer.lr=...`` on resume. The moments and the
        schedule's position stay the checkpoint's; the rate is the configured schedule's at that
        position (the same value LambdaLR computes, so an unchanged config resumes bit for bit)."""
        for group, settings in zip(self.optimizer.param_groups, groups, strict=True):
            group.update(settings)
        self.scheduler.base_lrs = list(base_lrs)
        position = self.scheduler.last_epoch
        for group, base, multiplier in zip(
            self.optimizer.param_groups, base_lrs, self.scheduler.lr_lambdas, strict=True
        ):
            group["lr"] = base * multiplier(position)
        # What get_last_lr reports; torch keeps it in a private attribute with no setter.
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def whole_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (a collective over its mesh), a tensor itself; detached."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def _sharding_meshes(
    mesh: DeviceMesh | None, *, tensor: bool, context: bool, expert: bool = False
) -> tuple[DeviceMesh | None, DeviceMesh | None]:
    """``(FSDP2's mesh, the batch shares' mesh)``. 1-D: the data-parallel ranks, both. With
    ``tp``: FSDP2 over ``dp`` (the tp ranks hold the same share). With ``cp``: FSDP2 over every
    rank (``dp × cp`` flattened, so its gradient reduction also sums the cp ranks' shares of the
    gradient), the shares over ``dp`` only (the cp ranks of a group hold the same rows). With
    ``ep``: every rank, both (the ep ranks are data-parallel ranks, :mod:`.expert_parallel`)."""
    if mesh is None or not (tensor or context or expert):
        return mesh, mesh
    if expert:
        every = mesh._flatten()
        return every, every
    data = _larger_than_one(mesh[DP])
    if tensor:
        return data, data
    # _flatten: how torch (and torchtitan) make the flattened dp×cp mesh of a 2-D one.
    return mesh._flatten(), data


def _larger_than_one(mesh: DeviceMesh) -> DeviceMesh | None:
    return mesh if mesh.size() > 1 else None


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """``{name: first name}`` for every parameter reached under a second name."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(parameter), name)
        if owner != name:
            tied[name] = owner
    return tied


def by_index(optimizer_state: dict[str, object]) -> bool:
    """``torch.optim.Optimizer.state_dict()``'s layout (integer keys), not the by-name one."""
    groups = optimizer_state.get("param_groups") or [{}]
    params = groups[0].get("params", []) if isinstance(groups, list) else []
    return any(isinstance(p, int) for p in params)
