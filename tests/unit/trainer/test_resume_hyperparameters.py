"""Resuming keeps the config's optimizer and schedule settings: loading a checkpoint restores the
moments and the schedule's position, never the old learning rate or weight decay (which would
silently undo ``policy.optimizer.lr=...`` on a resumed run)."""

from __future__ import annotations

import warnings

import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.test_packing import BASE, tiny_model


def trainer(*overrides: str) -> PolicyTrainer:
    # A constant schedule unless a test says otherwise (the quickstart warms up and decays).
    constant = ["policy.scheduler.name=constant", "policy.scheduler.warmup_steps=0"]
    config = load_config("configs/quickstart.yaml", [*BASE, *constant, *overrides])
    torch.manual_seed(0)
    return PolicyTrainer(tiny_model("qwen2"), config, torch.device("cpu"))


def advanced(policy: PolicyTrainer, steps: int) -> PolicyTrainer:
    with warnings.catch_warnings():  # the schedule moves without optimizer steps here
        warnings.simplefilter("ignore")
        for _ in range(steps):
            policy.scheduler.step()
    return policy


def test_a_resumed_trainer_uses_the_configured_learning_rate_and_weight_decay():
    saved = advanced(trainer("policy.optimizer.lr=0.01", "policy.optimizer.weight_decay=0.1"), 3)
    resumed = trainer("policy.optimizer.lr=0.002", "policy.optimizer.weight_decay=0.5")
    resumed.load_state_dict(saved.state_dict())
    assert resumed.scheduler.last_epoch == 3  # the position is the checkpoint's
    for group in resumed.optimizer.param_groups:
        assert group["lr"] == 0.002  # constant schedule: the configured rate itself
        assert group["weight_decay"] == 0.5
    assert resumed.scheduler.get_last_lr() == [0.002] * len(resumed.optimizer.param_groups)


def test_an_unchanged_config_resumes_the_schedule_exactly():
    schedule = ["policy.scheduler.name=linear", "policy.scheduler.warmup_steps=4"]
    saved = advanced(trainer(*schedule), 2)
    resumed = trainer(*schedule)
    resumed.load_state_dict(saved.state_dict())
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [
        g["lr"] for g in saved.optimizer.param_groups
    ]
    advanced(saved, 1), advanced(resumed, 1)
    assert resumed.scheduler.get_last_lr() == saved.scheduler.get_last_lr()
