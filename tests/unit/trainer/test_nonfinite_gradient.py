"""A step whose gradient is not finite is not applied (issue 44).

One token can make a whole step's gradient NaN (a ratio that overflowed float32 before the loss
bounded it; a forward that overflowed in low precision): the trainer must skip that optimizer
step, say so in the step's metrics and in the log, and keep its weights and optimizer state as
they were — never write NaN weights that every rollout worker would then load.

Two bad tokens: issue 44's, whose π_old is 100 below π_θ (the trainer's π_old pass is wrapped
to return that; the bounded loss now trains on it finitely), and a token whose forward is NaN
(a hook on the embedding: the model overflowed there; no bound in the loss can help).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from structlog.testing import capture_logs

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from tests.unit.trainer.test_batch_and_step import scored_group
from tests.unit.trainer.test_packing import BASE, PAD, on_policy, tiny_model, varied_batch

PRECISIONS = ["float32", "bfloat16"]


def lower_prev(trainer: PolicyTrainer, by: float) -> None:
    """The trainer's π_old pass returns, on the first valid token of the first sample, a
    log-prob ``by`` below the policy's; the reference pass is left alone."""
    original = trainer.batch_logprobs

    def batch_logprobs(model, batch):
        out = original(model, batch)
        if model is trainer.model:
            column = int(batch.token_mask[0].nonzero()[0])
            out[0, column] -= by
        return out

    trainer.batch_logprobs = batch_logprobs  # type: ignore[method-assign]


def trainer_in(precision: str) -> PolicyTrainer:
    config = load_config("configs/quickstart.yaml", [*BASE, f"policy.precision={precision}"])
    return PolicyTrainer(tiny_model("qwen2"), config)


def snapshot(trainer: PolicyTrainer) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    weights = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    return weights, copy.deepcopy(trainer.optimizer.state_dict())


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_ratio_of_e100_on_one_token_trains_finitely(precision):
    # lp − prev ≈ 100 on one valid token: the bounded ratio keeps the gradient finite, so the
    # step is applied (not skipped) and the weights stay finite.
    trainer = trainer_in(precision)
    lower_prev(trainer, 100.0)
    before, _ = snapshot(trainer)
    outcome = trainer.step(on_policy(varied_batch(), "qwen2"))
    assert math.isfinite(outcome.grad_norm) and outcome.grad_norm > 0
    assert outcome.as_metrics()["train/skipped_nonfinite_grad"] == 0.0
    assert outcome.loss.ratio_max > 1e8  # the token's ratio did reach the bound
    for name, p in trainer.model.named_parameters():
        assert torch.isfinite(p).all(), name
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


#: The token whose forward is NaN; it occurs once in :func:`batch_with_one_bad_token`.
BAD_TOKEN = 13


def batch_with_one_bad_token():
    responses = [[5, 6, 2], [7, 8, 2], [5, BAD_TOKEN, 2], [6, 2]]
    batch = build_batch([scored_group("g", [10, 9], responses, [1.0, 0.0, 1.0, 0.0])], PAD)
    assert int((batch.input_ids == BAD_TOKEN).sum()) == 1
    return on_policy(batch, "qwen2")


def nan_at_bad_token(trainer: PolicyTrainer) -> torch.utils.hooks.RemovableHandle:
    """The policy's embedding of :data:`BAD_TOKEN` becomes NaN in every forward pass."""

    def hook(module, args, output):
        return output.masked_fill((args[0] == BAD_TOKEN).unsqueeze(-1), math.nan)

    return trainer.model.model.embed_tokens.register_forward_hook(hook)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_non_finite_gradient_skips_the_step_and_says_so(precision):
    trainer = trainer_in(precision)
    nan_at_bad_token(trainer)
    weights, optimizer_state = snapshot(trainer)
    with capture_logs() as events:
        outcome = trainer.step(batch_with_one_bad_token())
    assert not math.isfinite(outcome.grad_norm)
    assert outcome.as_metrics()["train/skipped_nonfinite_grad"] == 1.0
    warnings = [e for e in events if e["event"] == "trainer.nonfinite_gradient_skipped"]
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
    # Weights and optimizer state exactly as before the step: nothing NaN was written, and the
    # optimizer took no step (AdamW has no state yet).
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p, weights[name]), name
    assert trainer.optimizer.state_dict()["state"] == optimizer_state["state"] == {}


def test_under_float16_loss_scaling_the_skipped_step_lowers_the_scale():
    # GradScaler's own overflow handling still runs: unscale_ found the inf, update() halves
    # the scale (its backoff factor) although the trainer did not call scaler.step.
    trainer = trainer_in("float16")
    nan_at_bad_token(trainer)
    scale = trainer.scaler.get_scale()
    weights, _ = snapshot(trainer)
    outcome = trainer.step(batch_with_one_bad_token())
    assert outcome.skipped_nonfinite_grad
    assert trainer.scaler.get_scale() == scale * trainer.scaler.get_backoff_factor()
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p, weights[name]), name


def test_the_next_finite_step_is_applied():
    trainer = trainer_in("float32")
    handle = nan_at_bad_token(trainer)
    batch = batch_with_one_bad_token()
    assert trainer.step(batch).as_metrics()["train/skipped_nonfinite_grad"] == 1.0
    handle.remove()
    weights, _ = snapshot(trainer)
    outcome = trainer.step(batch)
    assert outcome.as_metrics()["train/skipped_nonfinite_grad"] == 0.0
    assert math.isfinite(outcome.grad_norm)
    assert any(not torch.equal(p, weights[n]) for n, p in trainer.model.named_parameters())


# ---- the supervised warm start steps a torch optimizer of its own ---------------------------


def sft_run(poisoned: bool):
    from dockyard.config.sections.data import DatasetConfig
    from dockyard.config.sections.sft import SFTConfig
    from dockyard.consumers.trainer.sft import run_sft
    from dockyard.data.catalog import build_dataset
    from dockyard.models.tokenizers import build_character_tokenizer

    tokenizer = build_character_tokenizer()
    plus = tokenizer.convert_tokens_to_ids("+")  # in every arithmetic prompt
    model = tiny_model("qwen2")
    if poisoned:
        model.model.embed_tokens.register_forward_hook(
            lambda module, args, output: output.masked_fill(
                (args[0] == plus).unsqueeze(-1), math.nan
            )
        )
    dataset = build_dataset(
        DatasetConfig(name="arithmetic", params={"num_samples": 8, "seed": 0}), "arithmetic"
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = SFTConfig(max_num_steps=2, batch_size=2, lr=1e-3, val_period=100)
    with capture_logs() as events:
        result = run_sft(model, tokenizer, dataset, config, evaluate=lambda: 0.0)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    return result, events, changed, model


def test_the_warm_start_skips_a_non_finite_gradient():
    result, events, changed, model = sft_run(poisoned=True)
    assert result.skipped_nonfinite_grad_steps == 2
    assert changed == []
    assert all(torch.isfinite(p).all() for p in model.parameters())
    warnings = [e for e in events if e["event"] == "sft.nonfinite_gradient_skipped"]
    assert [w["step"] for w in warnings] == [1, 2]
    assert all(w["log_level"] == "warning" for w in warnings)
    # The same run without the NaN trains.
    result, _, changed, _ = sft_run(poisoned=False)
    assert result.skipped_nonfinite_grad_steps == 0 and changed


def test_the_ranks_outcome_of_a_skipped_step_says_it_was_skipped():
    from dockyard.algorithms.loss_metrics import LossMetrics
    from dockyard.consumers.trainer.policy_trainer import StepOutcome
    from dockyard.consumers.trainer.ranks import merge_outcomes

    def outcome(skipped: bool) -> StepOutcome:
        loss = LossMetrics(**{name: 0.0 for name in LossMetrics.__dataclass_fields__})
        norm = math.nan if skipped else 1.0
        return StepOutcome(
            loss, norm, 1e-4, 0.0, 0.0, 1.0, advantage_tokens=4, skipped_nonfinite_grad=skipped
        )

    merged = merge_outcomes([outcome(True), outcome(True)], [2, 2])
    assert merged.as_metrics()["train/skipped_nonfinite_grad"] == 1.0
    assert not merge_outcomes([outcome(False)] * 2, [2, 2]).skipped_nonfinite_grad
