"""Dispatcher pacing (async budget, sync one-step rule, deterministic resumable order) and the
trainer ledger (seen-set, in-flight accounting, trail rewritten on resume)."""

from __future__ import annotations

import pytest

from dockyard.broker.memory import MemoryPlane
from dockyard.broker.typed import MessagePlane
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.ledger import Ledger, read_trail
from dockyard.data.catalog import build_dataset
from dockyard.models import build_character_tokenizer
from dockyard.producers.dispatcher import Dispatcher, capacity
from dockyard.schemas import PromptGroup

SMALL = [
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=2",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=8",
    "data.train.params.num_samples=10",
    "grpo.max_num_epochs=2",
]


def config(*extra: str):
    return load_config("configs/quickstart.yaml", [*SMALL, *extra])


async def dispatched(plane: MemoryPlane) -> list[PromptGroup]:
    messages = MessagePlane(plane, stage="test")
    received = await messages.fetch(
        plane.names.prompt_consumer, PromptGroup, batch=100, timeout_s=0.1
    )
    return [item.message for item in received]


def make(cfg, plane):
    return Dispatcher(
        cfg,
        MessagePlane(plane, stage="dispatcher"),
        build_dataset(cfg.data.train, cfg.data.default_env),
        build_character_tokenizer(),
        run_id="r",
    )


def test_capacity_follows_the_staleness_budget():
    assert capacity(config("grpo.async_grpo.max_trajectory_age_steps=1")) == (1 + 1) * 4
    assert capacity(config("grpo.async_grpo.max_trajectory_age_steps=3")) == (3 + 1) * 4
    sync = config(
        "grpo.async_grpo.enabled=false",
        "loss_fn.use_importance_sampling_correction=false",
        "~loss_fn.truncated_importance_sampling_type",
        "~loss_fn.truncated_importance_sampling_ratio",
        "~loss_fn.truncated_importance_sampling_ratio_min",
    )
    assert capacity(sync) == 4  # one step's prompts


async def test_top_up_fills_to_capacity_and_no_further():
    cfg = config()
    async with MemoryPlane() as plane:
        dispatcher = make(cfg, plane)
        first = await dispatcher.top_up(in_flight=0, weight_version=3)
        assert len(first) == 8
        assert await dispatcher.top_up(in_flight=8, weight_version=3) == []
        assert len(await dispatcher.top_up(in_flight=5, weight_version=4)) == 3
        groups = await dispatched(plane)
        assert [g.group_id for g in groups] == first + [g.group_id for g in groups[8:]]
        assert {g.dispatch_weight_version for g in groups[:8]} == {3}
        assert all(g.num_generations == 2 for g in groups)


async def test_order_is_deterministic_and_resumes_from_the_saved_position():
    cfg = config()
    async with MemoryPlane() as plane:
        straight = make(cfg, plane)
        ids = [*await straight.top_up(0, 0), *await straight.top_up(0, 0)]
    async with MemoryPlane() as plane:
        first = make(cfg, plane)
        head = await first.top_up(0, 0)
        resumed = make(cfg, plane)
        resumed.load_state_dict(first.state_dict())
        tail = await resumed.top_up(0, 0)
    assert head + tail == ids
    assert len(set(ids)) == 16  # epoch 0 (10 prompts) then epoch 1 reuses the data, new ids


async def test_dispatching_stops_after_the_last_epoch():
    cfg = config()
    async with MemoryPlane() as plane:
        dispatcher = make(cfg, plane)
        total = 0
        while not dispatcher.exhausted:
            total += len(await dispatcher.top_up(0, 0))
        assert total == 2 * 10
        assert await dispatcher.top_up(0, 0) == []


def test_ledger_accounts_for_every_group_and_rewrites_its_trail(tmp_path):
    trail = tmp_path / "ledger.jsonl"
    ledger = Ledger(trail=trail)
    ledger.record_dispatched(["a", "b", "c", "d"])
    ledger.record_dispatched(["c", "e"])  # a restarted dispatcher re-issues "c"
    ledger.record_trained(["a", "b"], step=1)
    ledger.record_dropped("c", "stale")
    assert ledger.in_flight == 2  # d and e
    assert ledger.seen("a") and ledger.seen("c") and not ledger.seen("d")
    snapshot = ledger.snapshot()
    ledger.record_trained(["d"], step=2)  # a step after the checkpoint, then a crash
    restored = Ledger.restore(snapshot, trail)
    assert not restored.seen("d")
    events = read_trail(trail)
    assert [e["group_id"] for e in events if e["event"] == "trained"] == ["a", "b"]
    assert [e["group_id"] for e in events if e["event"] == "dispatched"] == list("abcde")


def test_groups_open_at_the_end_are_named_in_the_trail_and_stay_open(tmp_path):
    trail = tmp_path / "ledger.jsonl"
    ledger = Ledger(trail=trail)
    ledger.record_dispatched(["a", "b", "c", "d"])
    ledger.record_trained(["b"], step=1)
    ledger.record_dropped("c", "stale")
    assert ledger.record_open_at_end("the run reached grpo.max_num_steps=1") == ["a", "d"]
    events = [e for e in read_trail(trail) if e["event"] == "open_at_end"]
    assert [(e["group_id"], e["reason"]) for e in events] == [
        ("a", "the run reached grpo.max_num_steps=1"),
        ("d", "the run reached grpo.max_num_steps=1"),
    ]
    # Not settled: a resumed run still trains them (and the checkpoint does not record them).
    assert ledger.in_flight == 2 and not ledger.seen("a")
    assert ledger.snapshot()["dropped"] == {"c": "stale"}


@pytest.mark.parametrize("missing", ["trained", "dropped", "dispatched"])
def test_restore_needs_every_part_of_the_snapshot(missing):
    snapshot = Ledger().snapshot()
    del snapshot[missing]
    with pytest.raises(KeyError):
        Ledger.restore(snapshot, None)


def _prompt_lengths(cfg) -> list[int]:
    dataset = build_dataset(cfg.data.train, cfg.data.default_env)
    tokenizer = build_character_tokenizer()
    return [len(tokenizer(dataset[i].prompt)["input_ids"]) for i in range(len(dataset))]


async def test_prompts_over_the_input_cap_are_skipped_not_dispatched():
    mixed = ["data.train.params.low=1", "data.train.params.high=999"]  # 1- to 3-digit sums
    lengths = sorted(_prompt_lengths(config(*mixed)))
    cap = max(length for length in lengths if length < lengths[-1])  # some fit, some do not
    cfg = config(*mixed, f"data.max_input_seq_length={cap}")
    async with MemoryPlane() as plane:
        dispatcher = make(cfg, plane)
        sent = await dispatcher.top_up(in_flight=0, weight_version=0)
        groups = await dispatched(plane)
        assert [g.group_id for g in groups] == sent and sent
        assert all(len(g.prompt_token_ids) <= cap for g in groups)
        state, at = dispatcher.state, dispatcher.loaders[0].at  # data.train's position
        consumed = at.epoch * len(dispatcher.dataset) + at.position
        assert state.skipped_too_long > 0 and consumed == len(sent) + state.skipped_too_long


async def test_a_dataset_with_no_prompt_under_the_cap_ends_instead_of_looping():
    cap = min(_prompt_lengths(config())) - 1
    cfg = config(f"data.max_input_seq_length={cap}", "grpo.max_num_epochs=1000")
    async with MemoryPlane() as plane:
        dispatcher = make(cfg, plane)
        assert await dispatcher.top_up(in_flight=0, weight_version=0) == []
        assert dispatcher.exhausted
        assert dispatcher.state.skipped_too_long == len(dispatcher.dataset)
