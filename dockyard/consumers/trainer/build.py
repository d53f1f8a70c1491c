"""What the trainer loop is built from that takes time to make: the policy (loaded, moved to the
training device, sharded over the ranks), its trainer, the datasets, the evaluator, the
checkpoint directory, the metrics loggers. Built by :func:`build_parts` off the event loop
(:func:`~dockyard.consumers.trainer.loop.open_trainer`), in the order the unsharded trainer has
always used (the seed is set first: every rank loads alike)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from dockyard.checkpoints.directories import CheckpointManager
from dockyard.config.master import MasterConfig
from dockyard.consumers.trainer.backend import TrainerBackend, build_policy_trainer
from dockyard.consumers.trainer.evaluation import EpisodesFactory, Evaluator
from dockyard.consumers.trainer.ranks import TrainerRanks, load_trained_policy
from dockyard.data.base import Dataset
from dockyard.data.chat import build_prompt_dataset
from dockyard.environments.base import EnvironmentContext
from dockyard.environments.registry import build_environment
from dockyard.environments.tools.prompting import tool_prompts
from dockyard.models import load_processor, precision_dtype
from dockyard.models.vision import VisionProcessor
from dockyard.observability.metrics import MetricsLogger
from dockyard.observability.metrics.gpu_monitor import GpuMonitor, start_gpu_monitor


@dataclass(frozen=True)
class TrainerParts:
    model: torch.nn.Module  # float32 master weights (policy.precision is the compute precision)
    tokenizer: object
    processor: VisionProcessor | None  # a vision-language policy's
    #: Sharded, a forward pass is a collective of every rank: validation generates on rank 0
    #: alone, with this whole copy refreshed from the gathered weights before each run.
    evaluation_model: torch.nn.Module | None
    trainer: TrainerBackend
    ranks: TrainerRanks
    publish_dtype: torch.dtype  # policy.precision: the dtype of published weights
    train_data: Dataset
    evaluator: Evaluator | None  # with data.validation
    episodes: EpisodesFactory | None
    checkpoints: CheckpointManager | None  # with checkpointing.enabled
    metrics: MetricsLogger
    gpu_monitor: GpuMonitor | None

    @property
    def pad_token_id(self) -> int:
        return int(self.tokenizer.pad_token_id)  # type: ignore[attr-defined]  # an HF tokenizer


def build_parts(
    config: MasterConfig,
    run_dir: Path,
    *,
    mesh: DeviceMesh | None = None,
    episodes: EpisodesFactory | None = None,
) -> TrainerParts:
    """Blocking (seconds to minutes). ``mesh``: this is rank 0 of several trainer ranks.
    ``episodes``: with structured tool use, validation answers with episodes built by it."""
    model, tokenizer = load_trained_policy(config)
    evaluation_model = copy.deepcopy(model) if mesh is not None else None
    # Moves the model to the training device (and shards it over the mesh); torch, or JAX
    # with policy.jax_cfg.enabled.
    # A vision-language policy trains its samples' images (every forward pass gets them).
    processor = load_processor(config.policy.model_name)
    trainer = build_policy_trainer(model, config, mesh=mesh, processor=processor)
    ranks = TrainerRanks(trainer)
    if evaluation_model is not None:
        evaluation_model.to(trainer.device)
    data = config.data
    # Rendered as the dispatcher's prompts are (the tools described where episodes call them):
    # the warm start and the validation see what the rollouts see.
    tools = tool_prompts(config)
    train_data = build_prompt_dataset(data.train, data, config.policy.tokenizer, tokenizer, tools)
    evaluator = None
    if data.validation is not None:
        validation = build_prompt_dataset(
            data.validation, data, config.policy.tokenizer, tokenizer, tools
        )
        context = EnvironmentContext(env=config.env, distillation=config.on_policy_distillation)
        evaluator = Evaluator(
            evaluation_model or model,
            tokenizer,
            validation,
            build_environment(data.validation.env or data.default_env, context),
            max_new_tokens=config.policy.generation.max_new_tokens,
            max_samples=config.grpo.max_val_samples,
            batch_size=config.grpo.val_batch_size,
            episodes=episodes,
        )
    checkpointing = config.checkpointing
    return TrainerParts(
        model=model,
        tokenizer=tokenizer,
        processor=processor,
        evaluation_model=evaluation_model,
        trainer=trainer,
        ranks=ranks,
        publish_dtype=precision_dtype(config.policy.precision),
        train_data=train_data,
        evaluator=evaluator,
        episodes=episodes,
        checkpoints=(
            CheckpointManager(checkpointing, checkpointing.directory(run_dir))
            if checkpointing.enabled
            else None
        ),
        metrics=MetricsLogger(config.logger, config.logger.directory(run_dir)),
        gpu_monitor=start_gpu_monitor(config.logger),
    )
