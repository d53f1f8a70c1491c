"""On the tiny quickstart model and a fixed batch the JAX trainer computes the torch trainer's
step: the same π_old, loss metrics and gradients (to float32 rounding), and after a few
optimizer steps under a schedule, the same weights — mirrored into the torch model the loop
publishes from.

The configuration turns on what the step can do: micro-batch accumulation (2 rows each), a
reference KL penalty (so a frozen reference pass), the importance-sampling correction against
off-policy engine log-probs, tempered log-probs, gradient clipping that bites, AdamW with weight
decay and a warm-up + cosine schedule.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.models import load_policy
from tests.unit.trainer.test_batch_and_step import scored_group

OVERRIDES = [
    "policy.dtensor_cfg.enabled=false",
    "policy.jax_cfg.enabled=true",
    "policy.train_micro_batch_size=2",
    "policy.logprob_batch_size=3",
    "policy.generation.temperature=0.8",
    "policy.max_grad_norm=0.05",
    "policy.optimizer.lr=0.003",
    "policy.optimizer.weight_decay=0.1",
    "policy.scheduler.name=cosine",
    "policy.scheduler.warmup_steps=1",
    "policy.scheduler.total_steps=4",
    "loss_fn.reference_policy_kl_penalty=0.05",
    "loss_fn.use_importance_sampling_correction=true",
    # Both backends' π_old passes are compared (the quickstart skips them).
    "policy.skip_prev_logprobs=false",
    "loss_fn.force_on_policy_ratio=false",
]


def fixed_batch(extra: list[str] | None = None):
    """The config, the tiny quickstart policy and a fixed off-policy batch of two groups."""
    config = load_config("configs/quickstart.yaml", [*OVERRIDES, *(extra or [])])
    model, tokenizer = load_policy(config.policy.model_name)
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]
    eos = tokenizer.eos_token_id
    groups = [
        scored_group(
            "a",
            tokenizer("12+34=")["input_ids"],
            [[digits[4], digits[6], eos], [digits[5], eos], [digits[4], digits[6], eos], [eos]],
            [1.0, 0.0, 1.0, 0.0],
        ),
        scored_group(
            "b",
            tokenizer("51+7=")["input_ids"],
            [[digits[5], digits[8], eos], [digits[1], digits[2], digits[3], eos], [digits[9]]],
            [1.0, 0.0, 0.5],
        ),
    ]
    batch = build_batch(groups, tokenizer.pad_token_id)
    # Off-policy engine log-probs: the model's own, off by a different amount per token, so
    # the IS weights vary (inside the configured truncation bounds for most tokens).
    own = PolicyTrainer(copy.deepcopy(model), config).batch_logprobs(model, batch)
    noise = torch.linspace(-0.15, 0.15, batch.token_mask.numel()).view_as(batch.token_mask)
    batch = dataclasses.replace(batch, generation_logprobs=(own + noise) * batch.token_mask)
    return config, model, batch


@pytest.fixture(scope="module")
def setup():
    return fixed_batch()


def _grads_by_name(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}


@pytest.mark.slow
def test_loss_and_gradients_match_the_torch_trainer(setup):
    config, model, batch = setup
    torch_trainer = PolicyTrainer(copy.deepcopy(model), config)
    jax_trainer = JaxPolicyTrainer(copy.deepcopy(model), config)
    expected = torch_trainer.gradients(batch)
    actual = jax_trainer.gradients(batch)

    trained = batch.token_mask.bool()
    torch.testing.assert_close(
        actual.prev_logprobs[trained], expected.prev_logprobs[trained], rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(actual.advantages, expected.advantages, rtol=1e-5, atol=1e-6)
    assert expected.loss.is_weight_max > expected.loss.is_weight_min  # IS weights vary
    assert expected.loss.actor_loss != 0
    for key, value in expected.loss.as_dict().items():
        np.testing.assert_allclose(
            actual.metrics.as_dict()[key], value, rtol=1e-4, atol=1e-6, err_msg=key
        )

    torch_grads = _grads_by_name(torch_trainer.model)
    assert sorted(actual.grads) == sorted(torch_grads)
    for name, grad in torch_grads.items():
        scale = float(np.abs(grad).max())
        np.testing.assert_allclose(
            actual.grads[name], grad, rtol=1e-4, atol=1e-4 * scale, err_msg=name
        )


@pytest.mark.slow
def test_optimizer_steps_match_and_the_torch_model_mirrors_the_weights(setup):
    config, model, batch = setup
    torch_trainer = PolicyTrainer(copy.deepcopy(model), config)
    jax_trainer = JaxPolicyTrainer(copy.deepcopy(model), config)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        t_out = torch_trainer.step(batch)
        j_out = jax_trainer.step(batch)
        assert j_out.learning_rate == pytest.approx(t_out.learning_rate, rel=1e-6)
        assert j_out.grad_norm == pytest.approx(t_out.grad_norm, rel=1e-4)
        assert t_out.grad_norm > config.policy.max_grad_norm  # clipping acted
        assert j_out.loss.loss == pytest.approx(t_out.loss.loss, rel=1e-4, abs=1e-6)
        assert j_out.loss.kl == pytest.approx(t_out.loss.kl, rel=1e-3, abs=1e-9)
    assert t_out.loss.kl > 0  # the policy moved away from the frozen reference

    torch_state = torch_trainer.model.state_dict()
    jax_state = jax_trainer.model.state_dict()  # the mirror the loop publishes from
    lr = config.policy.optimizer.lr
    for name, value in torch_state.items():
        moved = (value - initial[name]).abs().max().item()
        assert moved > 0, name
        # Adam steps are ~lr per coordinate; float32 differences in the gradients move them by
        # a small fraction of that.
        torch.testing.assert_close(jax_state[name], value, rtol=0, atol=1e-2 * lr)
    assert (
        jax_state["lm_head.weight"].data_ptr() == jax_state["model.embed_tokens.weight"].data_ptr()
    )


def _continue_after_two_steps(setup, first_backend, second_backend):
    """Two steps of ``first_backend``, then its weights and ``state_dict()`` (what
    ``optimizer.pt`` holds) go into a fresh ``second_backend`` trainer; both take a third step
    and must agree (rate and weights). Without the moments the third step would differ
    (AdamW's first step moves every coordinate by ≈lr, a later one by less), and the schedule
    would restart its warm-up (lr 0 at step 0 of the 1-step warm-up)."""
    config, model, batch = setup
    first = first_backend(copy.deepcopy(model), config)
    for _ in range(2):
        first.step(batch)
    checkpoint = copy.deepcopy(first.state_dict())
    second = second_backend(copy.deepcopy(model), config)
    second.model.load_state_dict(first.model.state_dict())  # as read_checkpoint
    second.load_state_dict(checkpoint)

    expected, actual = first.step(batch), second.step(batch)
    assert actual.learning_rate == pytest.approx(expected.learning_rate, rel=1e-6)
    lr = config.policy.optimizer.lr
    for name, value in first.model.state_dict().items():
        torch.testing.assert_close(second.model.state_dict()[name], value, rtol=0, atol=1e-2 * lr)
    return second


@pytest.mark.slow
def test_a_torch_checkpoint_continues_under_jax_with_its_moments_and_schedule(setup):
    _continue_after_two_steps(setup, PolicyTrainer, JaxPolicyTrainer)


@pytest.mark.slow
def test_a_jax_checkpoint_continues_under_torch_with_its_moments_and_schedule(setup):
    resumed = _continue_after_two_steps(setup, JaxPolicyTrainer, PolicyTrainer)
    assert resumed.scheduler.last_epoch == 3


@pytest.mark.slow
def test_a_jax_checkpoint_resumes_under_jax_exactly(setup):
    """JAX → checkpoint → JAX: the moments and the schedule position come back bit for bit, so
    the resumed trainer's next step is the uninterrupted trainer's."""
    config, model, batch = setup
    running = JaxPolicyTrainer(copy.deepcopy(model), config)
    for _ in range(2):
        running.step(batch)
    resumed = JaxPolicyTrainer(copy.deepcopy(model), config)
    resumed.model.load_state_dict(running.model.state_dict())
    resumed.load_state_dict(copy.deepcopy(running.state_dict()))
    a, b = running.step(batch), resumed.step(batch)
    assert b.learning_rate == a.learning_rate
    for name, value in running.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=0, atol=0)
