"""Sequence packing and dynamic batching: bins, token budgets, and a loss that does not change.

The expected bins are worked by hand from the algorithms' definitions (see
``dockyard/consumers/trainer/bin_packing.py``). The equivalence tests hold the padded, fixed-size
micro-batches as the reference: a packed or token-budgeted layout must give the same log-probs,
loss and gradients in float32, which can only hold when no token attends across a sample boundary
and position ids restart for every sample.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.bin_packing import (
    first_fit_decreasing,
    modified_first_fit_decreasing,
    pack,
)
from dockyard.consumers.trainer.micro_batches import plan_micro_batches, sequence_lengths
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, token_logprobs
from dockyard.models.tiny import TinyModelSpec, build_tiny_model
from dockyard.models.tokenizers import build_character_tokenizer
from tests.unit.trainer.test_batch_and_step import scored_group

ALGORITHMS = ["first_fit_decreasing", "modified_first_fit_decreasing"]


def test_first_fit_decreasing_by_hand():
    # Longest first into the first bin with room (capacity 7): 5→A, 4→B, 3→B(7), 3→C, 2→A(7),
    # 2→C(5), 1→C(6).
    assert first_fit_decreasing([5, 4, 3, 3, 2, 2, 1], 7) == [[0, 4], [1, 2], [3, 5, 6]]


def test_modified_first_fit_decreasing_pairs_small_items_into_a_large_bin():
    # Capacity 18: 10 is large (> 9); 4, 4, 6 are small (in (3, 6]); 1 is tiny. No medium item,
    # so the large bin takes the two smallest small items that fit its room of 8 (4 + 4); the
    # leftovers 6 and 1 open one bin. FFD instead puts 6 with the 10 and leaves 4 + 4 apart.
    lengths = [10, 4, 4, 6, 1]
    assert modified_first_fit_decreasing(lengths, 18) == [[0, 1, 2], [3, 4]]
    assert first_fit_decreasing(lengths, 18) == [[0, 3, 4], [1, 2]]


def test_modified_first_fit_decreasing_gives_a_large_bin_its_medium_item():
    # Capacity 12: 7 large, 5 medium (in (4, 6]) joins it; 3, 3, 2, 1 fill one new bin.
    assert modified_first_fit_decreasing([7, 5, 3, 3, 2, 1], 12) == [[0, 1], [2, 3, 4, 5]]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bins_hold_every_sequence_once_within_the_budget(algorithm):
    rng = random.Random(7)
    for _ in range(50):
        capacity = rng.randint(8, 64)
        lengths = [rng.randint(0, capacity) for _ in range(rng.randint(1, 40))]
        bins = pack(lengths, capacity, algorithm)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in b) <= capacity for b in bins)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_sequence_longer_than_the_budget_is_refused(algorithm):
    with pytest.raises(ValueError, match="more than the micro-batch token budget 8"):
        pack([3, 9], 8, algorithm)


# ---- the trainer ----------------------------------------------------------------------------

PAD = 0


def varied_groups(seed: int = 3, count: int = 3):
    """``count`` groups (the first three always the same) with prompts of 1–6 tokens and
    responses of 1–9 tokens (lengths 2–15)."""
    rng = random.Random(seed)
    groups = []
    for g in range(count):
        prompt = [rng.randint(1, 14) for _ in range(rng.randint(1, 6))]
        responses = [[rng.randint(1, 14) for _ in range(rng.randint(1, 9))] for _ in range(4)]
        rewards = [float(rng.random() > 0.5) for _ in responses]
        groups.append(scored_group(f"g{g}", prompt, responses, rewards))
    return groups


def varied_batch(seed: int = 3, count: int = 3):
    """:func:`varied_groups`, stacked."""
    return build_batch(varied_groups(seed, count), PAD)


BASE = [
    "policy.train_micro_batch_size=2",
    "policy.logprob_batch_size=4",
    "policy.max_total_sequence_length=16",
    # A reference model too, so the reference pass goes through the same plans.
    "loss_fn.reference_policy_kl_penalty=0.1",
    # The π_old pass too (the quickstart skips it), so it goes through the same plans.
    "policy.skip_prev_logprobs=false",
    "loss_fn.force_on_policy_ratio=false",
]
PACKED = [
    "policy.sequence_packing.enabled=true",
    "policy.sequence_packing.train_mb_tokens=32",
    "policy.sequence_packing.logprob_mb_tokens=40",
]
DYNAMIC = [
    "policy.dynamic_batching.enabled=true",
    "policy.dynamic_batching.train_mb_tokens=48",
    "policy.dynamic_batching.logprob_mb_tokens=64",
    "policy.dynamic_batching.sequence_length_round=8",
]

LAYOUTS = {"padded": [], "packed": PACKED, "dynamic": DYNAMIC}


def tiny_model(arch: str):
    spec = TinyModelSpec(arch=arch, max_position_embeddings=64)
    return build_tiny_model(spec, build_character_tokenizer())


def on_policy(batch, arch: str):
    """The batch with the engine's log-probs set to the model's own (padded, one pass)."""
    with torch.no_grad():
        own = token_logprobs(tiny_model(arch), batch)
    return dataclasses.replace(batch, generation_logprobs=own * batch.token_mask)


def gradients_under(overrides: list[str], arch: str, batch, *, varlen: bool = False):
    config = load_config("configs/quickstart.yaml", BASE + overrides)
    model = tiny_model(arch)
    trainer = PolicyTrainer(model, config)
    trainer.varlen = varlen  # the one-row layout flash-attention gets, here under SDPA
    result = trainer.gradients(batch)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return trainer, result, grads


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("layout", [PACKED, DYNAMIC], ids=["packed", "dynamic"])
def test_loss_and_gradients_equal_the_padded_ones(arch, layout):
    batch = on_policy(varied_batch(), arch)
    _, padded, padded_grads = gradients_under([], arch, batch)
    trainer, other, other_grads = gradients_under(layout, arch, batch)
    check_equal(batch, padded, padded_grads, other, other_grads)
    # The layout under test is not the padded one in disguise.
    plans = trainer.plan(batch, "train")
    if layout is PACKED:  # rows holding several samples, micro-batches several rows
        assert any(p.size > p.input_ids.shape[0] > 1 for p in plans)
    else:  # fewer passes than the fixed plan's 6 of 2 samples
        assert len(plans) < batch.size // 2


def test_one_packed_row_per_micro_batch_equals_padded_too():
    batch = on_policy(varied_batch(), "qwen2")
    _, padded, padded_grads = gradients_under([], "qwen2", batch)
    trainer, other, other_grads = gradients_under(PACKED, "qwen2", batch, varlen=True)
    check_equal(batch, padded, padded_grads, other, other_grads)
    assert all(p.input_ids.shape[0] == 1 for p in trainer.plan(batch, "train"))


def check_equal(batch, padded, padded_grads, other, other_grads) -> None:
    """Log-probs, loss, KL, counts and every parameter's gradient as in the padded layout."""
    mask = batch.token_mask.bool()
    torch.testing.assert_close(
        other.prev_logprobs[mask], padded.prev_logprobs[mask], rtol=1e-5, atol=1e-6
    )
    assert other.loss.loss == pytest.approx(padded.loss.loss, rel=1e-5, abs=1e-7)
    assert other.loss.num_valid_tokens == padded.loss.num_valid_tokens
    assert other.loss.kl == pytest.approx(padded.loss.kl, rel=1e-4, abs=1e-7)
    assert sum(float(g.abs().sum()) for g in padded_grads.values()) > 0
    for name, grad in padded_grads.items():
        torch.testing.assert_close(other_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("varlen", [False, True], ids=["sdpa", "flash-attention"])
def test_packed_rows_hold_several_samples_with_restarting_positions(varlen):
    batch = varied_batch()
    config = load_config("configs/quickstart.yaml", BASE + PACKED)
    lengths = sequence_lengths(batch)
    plans = plan_micro_batches(batch, config.policy, "train", varlen=varlen)
    assert sorted(i for p in plans for i in p.indices.tolist()) == list(range(batch.size))
    # Without a variable-length kernel a row is as long as the longest sample (attention is
    # quadratic in the row); with one, a row is the whole budget of 32 tokens.
    row_capacity = 32 if varlen else max(lengths)
    for plan in plans:
        assert plan.num_tokens <= 32
        assert plan.attention_mask is None and plan.position_ids is not None
        assert plan.input_ids.shape[0] == (1 if varlen else 32 // max(lengths)) or plan is plans[-1]
        assert plan.input_ids.shape[1] <= row_capacity
        # Positions restart at 0 for each sample, row after row, in the order of the indices.
        expected = [t for i in plan.indices.tolist() for t in range(lengths[i])]
        got = [
            int(position)
            for row, ids in zip(plan.position_ids, plan.input_ids, strict=True)
            for position, token in zip(row, ids, strict=True)
            if token != PAD
        ]
        assert got == expected
    assert any(p.size > p.input_ids.shape[0] for p in plans)  # a row holds several samples


def test_dynamic_micro_batches_keep_to_the_budget_and_the_rounding():
    batch = varied_batch()
    config = load_config("configs/quickstart.yaml", BASE + DYNAMIC)
    plans = plan_micro_batches(batch, config.policy, "train")
    assert sorted(i for p in plans for i in p.indices.tolist()) == list(range(batch.size))
    for plan in plans:
        assert plan.num_tokens <= 48
        assert plan.input_ids.shape[1] % 8 == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=8"],
            "policy.sequence_packing.train_mb_tokens: 8 tokens cannot hold one "
            "sequence of max_total_sequence_length (16 tokens)",
        ),
        (
            [
                "policy.dynamic_batching.enabled=true",
                "policy.dynamic_batching.logprob_mb_tokens=32",
            ],
            # max_total_sequence_length 16 rounds up to sequence_length_round's default 64.
            "policy.dynamic_batching.logprob_mb_tokens: 32 tokens cannot hold one "
            "sequence of max_total_sequence_length (64 tokens",
        ),
        (
            # Unset: train_micro_batch_size 2 × max_total_sequence_length 16 = 32 < 64.
            ["policy.dynamic_batching.enabled=true", "policy.train_micro_batch_size=2"],
            "policy.dynamic_batching.train_mb_tokens: unset, so train_micro_batch_size × "
            "max_total_sequence_length = 32 tokens, cannot hold one sequence",
        ),
    ],
)
def test_a_budget_below_the_longest_sequence_is_refused_at_load(overrides, message):
    from dockyard.config.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        load_config("configs/quickstart.yaml", overrides)
    assert message in str(raised.value)
