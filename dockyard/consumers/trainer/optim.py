"""Optimizer and learning-rate schedule from ``policy.optimizer`` / ``policy.scheduler``."""

from __future__ import annotations

import math

import torch

from dockyard.config.sections.policy import OptimizerConfig, SchedulerConfig


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    parameters = [p for p in model.parameters() if p.requires_grad]
    if config.name == "sgd":
        return torch.optim.SGD(parameters, lr=config.lr, weight_decay=config.weight_decay)
    optimizer_class = torch.optim.AdamW if config.name == "adamw" else torch.optim.Adam
    return optimizer_class(
        parameters,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )


def lr_multiplier(step: int, config: SchedulerConfig, total_steps: int) -> float:
    """Linear warm-up, then constant / linear / cosine decay to ``min_lr_ratio``."""
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.name == "constant":
        return 1.0
    decay_steps = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    floor = config.min_lr_ratio
    if config.name == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: SchedulerConfig, default_total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    total = config.total_steps or default_total_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, config, total)
    )
