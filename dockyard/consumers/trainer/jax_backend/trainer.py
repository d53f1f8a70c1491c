"""The JAX (Flax NNX) policy trainer: :class:`~dockyard.consumers.trainer.policy_trainer.
PolicyTrainer`'s step, with the model math in JAX.

What runs where:

- the policy forward passes (π_old, the reference, the trained pass), the loss
  (:mod:`.loss`), the gradients and the optimizer update (:mod:`.optim`) are JAX, compiled with
  ``jax.jit`` (one program for the log-prob passes, one for gradient accumulation over the
  micro-batches — a ``lax.scan`` — and one for the update), sharded over a ``jax.sharding``
  mesh when ``policy.jax_cfg`` asks for more than one device (:mod:`.mesh`);
- per-sample preparation — sample filters, reward shaping and advantage estimation — is the
  torch trainer's own code on the host (small ``[B]`` / ``[B, T]`` arrays, no model), so the
  two backends cannot drift apart there.

The torch model the trainer loop holds stays the **mirror** of the JAX parameters: after every
step they are copied into it by name (:mod:`.weights`). So everything downstream of the trainer
— publishing weights to the rollout engines (same names, same bytes, same digests), validation,
checkpoints — is unchanged and backend-neutral. The other direction: when anything writes the
torch model in place (the supervised warm start, a checkpoint being loaded), the next step takes
its weights back in before training (each parameter's in-place version counter says so).

Batches are padded to fixed shapes before they reach a compiled program — rows to a multiple of
the micro-batch (times the data-parallel size), columns up to ``max_total_sequence_length`` in
steps of 64 — so steps of the same size reuse one compilation. Padded rows have sample mask 0
and padded columns token mask 0: they add nothing to the loss, its gradients or its counts.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx
from jax.sharding import Mesh

from dockyard.algorithms.advantages import build_estimator
from dockyard.algorithms.grpo import MasterConfig
from dockyard.algorithms.loss import GlobalCounts
from dockyard.algorithms.loss_metrics import LossMetrics
from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.jax_backend.convert import (
    optax_state_from_torch,
    torch_state_from_optax,
)
from dockyard.consumers.trainer.jax_backend.loss import (
    Counts,
    LossBatch,
    clipped_pg_loss,
    initial_metric_vector,
    loss_metrics,
    merge_metric_vectors,
)
from dockyard.consumers.trainer.jax_backend.mesh import (
    batch_sharding,
    build_mesh,
    parameter_sharding,
)
from dockyard.consumers.trainer.jax_backend.model import (
    CausalLM,
    DecoderShape,
    next_token_logprobs,
)
from dockyard.consumers.trainer.jax_backend.optim import build_transform
from dockyard.consumers.trainer.jax_backend.weights import (
    ParamState,
    host_arrays,
    load_named,
    parameter_name,
)
from dockyard.consumers.trainer.optim import build_optimizer, build_scheduler, lr_multiplier
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, StepOutcome
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_COLUMN_STEP = 64


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class JaxGradients:
    """What :meth:`JaxPolicyTrainer.gradients` computed: the summed micro-batch gradients by
    torch name (host float32), the merged loss metrics, and the step's preparation."""

    grads: dict[str, np.ndarray]
    metrics: LossMetrics
    prev_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_mask: torch.Tensor
    filtered_fraction: float


class JaxPolicyTrainer:
    """``policy.jax_cfg.enabled``: the trainer loop's policy trainer, in JAX. Same interface as
    :class:`PolicyTrainer` where the loop uses it: ``model``, ``device``, ``step``,
    ``state_dict`` / ``load_state_dict``."""

    # Backend-neutral host-side preparation, shared with the torch trainer (they read only
    # ``config`` and ``estimator``): one definition of filtering, rewards and advantages.
    filter_samples = PolicyTrainer.filter_samples
    rewards = PolicyTrainer.rewards
    advantages = PolicyTrainer.advantages

    def __init__(
        self, model: torch.nn.Module, config: MasterConfig, *, devices: list[Any] | None = None
    ) -> None:
        policy = config.policy
        if policy.precision not in _COMPUTE_DTYPES:
            raise ValueError(
                f"policy.precision={policy.precision!r}: the JAX backend computes in "
                f"{' or '.join(_COMPUTE_DTYPES)} (float16 would need loss scaling)"
            )
        self.config = config
        self.device = torch.device("cpu")  # where the host-side preparation runs
        self.model = model.to(device=self.device, dtype=torch.float32).eval()
        self.estimator = build_estimator(config.grpo, config.loss_fn)
        self.temperature = policy.generation.temperature
        self.compute_dtype = _COMPUTE_DTYPES[policy.precision]
        self.shape = DecoderShape.from_hf_config(model.config)
        self.jax_mesh: Mesh | None = build_mesh(policy.jax_cfg, devices)
        # What TrainerRanks reads of a torch trainer: one process, no torchrun ranks, no LoRA
        # (the JAX mesh spans this process's devices; lora_cfg is dtensor_cfg's).
        self.mesh = None
        self.tensor_mesh = None
        self.peft = None
        self.data_parallel = policy.jax_cfg.data_parallel_size if self.jax_mesh is not None else 1
        self.graph, self._template = nnx.split(CausalLM(self.shape, rngs=nnx.Rngs(0)))
        self.params = self._pull()
        needs_reference = config.loss_fn.reference_policy_kl_penalty > 0
        # The initial policy, frozen (as the torch trainer's deep copy, taken at construction).
        self.reference = jax.tree.map(jnp.copy, self.params) if needs_reference else None
        self.transform = build_transform(policy.optimizer, policy.max_grad_norm)
        self.opt_state = self.transform.init(self.params)
        self.schedule_step = 0
        self.total_steps = policy.scheduler.total_steps or config.grpo.max_num_steps
        self._logprobs = jax.jit(self._logprobs_program)
        self._accumulate = jax.jit(self._accumulate_program)
        self._apply = jax.jit(self._apply_program, donate_argnums=(0, 1))
        log.info(
            "trainer.placement",
            backend="jax",
            devices=[
                str(d) for d in (self.jax_mesh.devices.flat if self.jax_mesh else jax.devices()[:1])
            ],
            data_parallel=self.data_parallel,
            tensor_parallel=policy.jax_cfg.tensor_parallel_size if self.jax_mesh else 1,
            precision=policy.precision,
            master_weights="float32",
        )

    # ---- weights between the torch mirror and JAX ------------------------------------------

    def _versions(self) -> tuple[int, ...]:
        return tuple(p._version for p in self.model.parameters())

    def _pull(self) -> ParamState:
        arrays = {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}
        state = load_named(
            self._template, arrays, tied=self.shape.tie_word_embeddings, where="the policy"
        )
        self._mirrored = self._versions()
        return self._place(state)

    def _place(self, state: ParamState) -> ParamState:
        if self.jax_mesh is None:
            placed: ParamState = jax.device_put(state)  # device_put returns its input's tree
            return placed
        mesh = self.jax_mesh
        flat = [
            (
                path,
                variable.replace(
                    jax.device_put(
                        variable.get_value(),
                        parameter_sharding(mesh, parameter_name(path), variable.get_value().shape),
                    )
                ),
            )
            for path, variable in nnx.to_flat_state(state)
        ]
        return nnx.from_flat_state(flat)

    def _push(self) -> None:
        arrays = host_arrays(self.params, tied=self.shape.tie_word_embeddings)
        # load_state_dict copies into the existing parameters (tied ones stay shared); the
        # host arrays may be read-only views of device buffers, hence from_numpy of a copy.
        self.model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in arrays.items()})
        self._mirrored = self._versions()

    def _sync_from_mirror(self) -> None:
        """Take the torch model's weights back if something wrote them since the last step."""
        if self._versions() != self._mirrored:
            log.info("trainer.jax_weights_reloaded", reason="the torch policy was written")
            self.params = self._pull()

    # ---- compiled programs -------------------------------------------------------------------

    def _token_logprobs(self, params: ParamState, ids: jax.Array, attn: jax.Array) -> jax.Array:
        model = nnx.merge(self.graph, params)
        logits = model(ids, attn, self.compute_dtype)
        return next_token_logprobs(logits, ids, self.temperature)

    def _logprobs_program(self, params: ParamState, ids: jax.Array, attn: jax.Array) -> jax.Array:
        """``[n, r, L]`` chunks → ``[n, r, L-1]`` log-probs, one chunk at a time."""
        mapped: jax.Array = jax.lax.map(
            lambda chunk: self._token_logprobs(params, *chunk), (ids, attn)
        )
        return mapped

    def _accumulate_program(
        self, params: ParamState, micro: dict[str, jax.Array], counts: Counts
    ) -> tuple[ParamState, jax.Array]:
        """Gradients summed over the micro-batches (each loss its share of the full-batch loss,
        so the sum is the full-batch gradient) and the merged metric vector."""
        cfg = self.config.loss_fn

        def body(
            carry: tuple[ParamState, jax.Array], chunk: dict[str, jax.Array]
        ) -> tuple[tuple[ParamState, jax.Array], None]:
            grads, metrics = carry

            def loss_of(p: ParamState) -> tuple[jax.Array, jax.Array]:
                lp = self._token_logprobs(p, chunk["input_ids"], chunk["attention_mask"])
                batch = LossBatch(
                    prev_logprobs=chunk["prev_logprobs"],
                    generation_logprobs=chunk["generation_logprobs"],
                    advantages=chunk["advantages"],
                    token_mask=chunk["token_mask"],
                    sample_mask=chunk["sample_mask"],
                    rewards=chunk["rewards"],
                    reference_logprobs=chunk.get("reference_logprobs"),
                )
                return clipped_pg_loss(cfg, lp, batch, counts)

            (_, vector), g = jax.value_and_grad(loss_of, has_aux=True)(params)
            return (jax.tree.map(jnp.add, grads, g), merge_metric_vectors(metrics, vector)), None

        init = (jax.tree.map(jnp.zeros_like, params), initial_metric_vector())
        (grads, metrics), _ = jax.lax.scan(body, init, micro)
        return grads, metrics

    def _apply_program(
        self, params: ParamState, opt_state: Any, grads: ParamState, learning_rate: jax.Array
    ) -> tuple[ParamState, Any, jax.Array]:
        """The update, or — when the gradient is not finite — the parameters and optimizer
        state unchanged (as the torch trainer skips ``optimizer.step()``): optax would write
        NaN into every weight and moment. Selected on the device, so the program has one shape
        either way."""
        norm = optax.tree.norm(grads)
        opt_state.hyperparams["learning_rate"] = learning_rate
        updates, new_state = self.transform.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        finite = jnp.isfinite(norm)

        def keep_if_not_finite(new: Any, old: Any) -> Any:
            return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)

        return (
            keep_if_not_finite(new_params, params),
            keep_if_not_finite(new_state, opt_state),
            norm,
        )

    # ---- host side -----------------------------------------------------------------------------

    def _columns(self, length: int) -> int:
        limit = max(self.config.policy.max_total_sequence_length, length)
        return min(_round_up(length, _COLUMN_STEP), limit)

    def _chunks(
        self, values: dict[str, torch.Tensor], rows_per_chunk: int, width: int
    ) -> dict[str, jax.Array]:
        """Pad every array to ``[n·rows_per_chunk, …]`` (and the padded column count), reshape
        to ``[n, rows_per_chunk, …]`` and place it (rows split along ``data``)."""
        rows = next(iter(values.values())).shape[0]
        padded_rows = _round_up(max(rows, 1), rows_per_chunk)
        out = {}
        for name, tensor in values.items():
            array = tensor.detach().cpu().numpy()
            pad = [(0, padded_rows - rows)]
            if array.ndim == 2:
                columns = width + (1 if name in ("input_ids", "attention_mask") else 0)
                pad.append((0, columns - array.shape[1]))
            array = np.pad(array, pad)
            array = array.reshape(padded_rows // rows_per_chunk, rows_per_chunk, *array.shape[1:])
            if self.jax_mesh is not None:
                out[name] = jax.device_put(array, batch_sharding(self.jax_mesh, array.ndim))
            else:
                out[name] = jax.device_put(array)
        return out

    def batch_logprobs(self, model: torch.nn.Module, batch: TrainingBatch) -> torch.Tensor:
        """:meth:`PolicyTrainer.batch_logprobs` of the trained policy (``model`` must be this
        trainer's mirror: the JAX parameters are what is scored)."""
        if model is not self.model:
            raise ValueError("the JAX trainer scores its own policy only (trainer.model)")
        self._sync_from_mirror()
        return self._batch_logprobs(self.params, batch.to(self.device))

    def model_state(self) -> dict[str, torch.Tensor]:
        """The weights by name: the torch mirror's (tied names share one tensor)."""
        return self.model.state_dict()

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What a weight event carries: the whole weights (no LoRA under JAX)."""
        return self.model_state()

    def _batch_logprobs(self, params: ParamState, batch: TrainingBatch) -> torch.Tensor:
        """``[B, L-1]`` next-token log-probs of every sample under ``params`` (host float32)."""
        rows = self.config.policy.logprob_batch_size * self.data_parallel
        chunks = self._chunks(
            {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask},
            rows,
            self._columns(batch.token_mask.shape[1]),
        )
        out = np.asarray(self._logprobs(params, chunks["input_ids"], chunks["attention_mask"]))
        out = out.reshape(-1, out.shape[-1])[: batch.size, : batch.token_mask.shape[1]]
        # 0 past each sample's last target, as the torch trainer leaves it.
        return torch.from_numpy(out.copy()) * batch.attention_mask[:, 1:].bool()

    def gradients(self, batch: TrainingBatch) -> JaxGradients:
        """π_old, the reference, filters and advantages, then the summed gradients of the loss
        (on the host, by torch name); the parameters are not changed."""
        result = self._gradients(batch)
        return dataclasses.replace(result, grads=host_arrays(self._pending, tied=False))

    def _gradients(self, batch: TrainingBatch) -> JaxGradients:
        """:meth:`gradients` leaving them on the device (in ``_pending``) for the update."""
        self._sync_from_mirror()
        batch = batch.to(self.device)
        prev = (
            torch.zeros_like(batch.generation_logprobs)
            if self.config.policy.skip_prev_logprobs
            else self._batch_logprobs(self.params, batch)
        )
        reference = (
            self._batch_logprobs(self.reference, batch) if self.reference is not None else None
        )
        batch, filtered = self.filter_samples(batch, prev)  # type: ignore[misc]  # a PolicyTrainer method borrowed above: it reads only what this class has
        advantages = self.advantages(batch, prev, reference)  # type: ignore[misc]  # a PolicyTrainer method borrowed above: it reads only what this class has
        counts = GlobalCounts.from_batch(batch.token_mask, batch.sample_mask, batch.rewards)
        values = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "prev_logprobs": prev,
            "generation_logprobs": batch.generation_logprobs,
            "advantages": advantages,  # [B, L-1], as compute_advantages returns them
            "token_mask": batch.token_mask,
            "sample_mask": batch.sample_mask,
            "rewards": batch.rewards,
        }
        if reference is not None:
            values["reference_logprobs"] = reference
        values = {k: v.float() if k != "input_ids" else v for k, v in values.items()}
        micro = self._chunks(
            values,
            self.config.policy.train_micro_batch_size * self.data_parallel,
            self._columns(batch.token_mask.shape[1]),
        )
        scalars = Counts(
            *(
                jnp.float32(c)
                for c in (counts.valid_tokens, counts.valid_sequences, counts.positive_tokens)
            )
        )
        grads, vector = self._accumulate(self.params, micro, scalars)
        self._pending = grads
        return JaxGradients(
            grads={},
            metrics=loss_metrics(vector),
            prev_logprobs=prev,
            advantages=advantages,
            token_mask=batch.token_mask,
            filtered_fraction=filtered,
        )

    def _learning_rate(self, step: int) -> float:
        """The configured schedule's rate at ``step`` (the torch backend's own function)."""
        policy = self.config.policy
        return policy.optimizer.lr * lr_multiplier(step, policy.scheduler, self.total_steps)

    def step(self, batch: TrainingBatch) -> StepOutcome:
        started = time.perf_counter()
        result = self._gradients(batch)
        learning_rate = self._learning_rate(self.schedule_step)
        self.params, self.opt_state, norm = self._apply(
            self.params, self.opt_state, self._pending, jnp.float32(learning_rate)
        )
        self._pending = None
        # The schedule counts steps whether or not this one was applied, as the torch trainer's.
        self.schedule_step += 1
        applied = bool(np.isfinite(float(norm)))
        if applied:
            self._push()
        else:
            log.warning(
                "trainer.nonfinite_gradient_skipped",
                grad_norm=float(norm),
                loss=result.metrics.loss,
                loss_scale=None,
                reason="the optimizer step is not applied; the weights stay as they were",
            )
        advantages, valid = result.advantages, result.token_mask.bool()
        return StepOutcome(
            loss=result.metrics,
            grad_norm=float(norm),
            learning_rate=float(learning_rate),
            advantage_mean=float(advantages[valid].mean()) if valid.any() else 0.0,
            advantage_abs_mean=float(advantages[valid].abs().mean()) if valid.any() else 0.0,
            filtered_fraction=result.filtered_fraction,
            seconds=time.perf_counter() - started,
            skipped_nonfinite_grad=not applied,
        )

    # ---- optimizer state in checkpoints ------------------------------------------------------

    def state_dict(self) -> dict[str, object]:
        """The torch trainer's layout (:mod:`.convert`): a checkpoint of either backend resumes
        under the other."""
        policy = self.config.policy
        optimizer = build_optimizer(self.model, policy.optimizer)
        scheduler = build_scheduler(optimizer, policy.scheduler, self.config.grpo.max_num_steps)
        schedule = scheduler.state_dict()
        # LambdaLR's position after ``schedule_step`` steps, as the torch trainer saves it.
        schedule.update(
            last_epoch=self.schedule_step,
            _step_count=self.schedule_step + 1,
            _last_lr=[self._learning_rate(self.schedule_step)],
        )
        return {
            "optimizer": torch_state_from_optax(self.opt_state, optimizer, self.model),
            "scheduler": schedule,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        optimizer, schedule = state["optimizer"], state["scheduler"]
        if not isinstance(optimizer, dict) or not isinstance(schedule, dict):
            raise ValueError("optimizer state: expected the trainer's optimizer and scheduler")
        self.opt_state = optax_state_from_torch(
            self.opt_state, optimizer, self.model, self._template, self._place
        )
        self.schedule_step = int(schedule["last_epoch"])
        log.info("trainer.optimizer_loaded", step=self.schedule_step)
