"""The JAX trainer, as the torch one (tests/unit/trainer/test_nonfinite_gradient.py), never
applies a non-finite gradient: the update is skipped, the step says so in its metrics and the
log, and the parameters, the optimizer state and the torch mirror stay as they were (issue 44).

The bad token: one valid token's advantage is NaN (the host-side advantages are wrapped), which
makes −A·r's gradient NaN whatever the ratio bound does.
"""

from __future__ import annotations

import copy
import math

import jax
import numpy as np
import pytest
import torch
from structlog.testing import capture_logs

from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer
from tests.unit.trainer.jax_backend.test_trainer_matches_torch import fixed_batch


def nan_advantage_on_one_token(trainer: JaxPolicyTrainer) -> None:
    original = trainer.advantages

    def advantages(batch, prev, reference):
        out = original(batch, prev, reference).clone()
        out[0, int(batch.token_mask[0].nonzero()[0])] = math.nan
        return out

    trainer.advantages = advantages  # type: ignore[method-assign]


def host(tree) -> list[np.ndarray]:
    return [np.asarray(leaf).copy() for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_non_finite_gradient_is_not_applied(precision):
    config, model, batch = fixed_batch([f"policy.precision={precision}"])
    trainer = JaxPolicyTrainer(copy.deepcopy(model), config)
    trainer.step(batch)  # one good step first: the optimizer state has moments to keep
    params, opt_state = host(trainer.params), host(trainer.opt_state)
    mirror = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    nan_advantage_on_one_token(trainer)
    with capture_logs() as events:
        outcome = trainer.step(batch)
    assert not math.isfinite(outcome.grad_norm)
    assert outcome.as_metrics()["train/skipped_nonfinite_grad"] == 1.0
    warnings = [e for e in events if e["event"] == "trainer.nonfinite_gradient_skipped"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    for before, after in zip(params, host(trainer.params), strict=True):
        np.testing.assert_array_equal(after, before)
    for before, after in zip(opt_state, host(trainer.opt_state), strict=True):
        np.testing.assert_array_equal(after, before)
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, mirror[name]), name
    # The schedule keeps counting steps (its position is the trainer's step, as in torch).
    assert trainer.schedule_step == 2
