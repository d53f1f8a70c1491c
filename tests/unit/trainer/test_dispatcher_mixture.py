"""Several training dataloaders (``data.extra_train_dataloaders``, sync GRPO): the dispatcher
mixes them by round robin — each loader with epochs left gives one prompt in its turn, so each
gives 1 / (1 + number of extra loaders) of the prompts — every loader walks its own seeded
permutations with its own env and agent name, and a checkpoint resumes each where it stopped."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from dockyard.broker.memory import MemoryPlane
from dockyard.broker.typed import MessagePlane
from dockyard.commands._cli import CliError
from dockyard.commands._roles import prepare_trainer
from dockyard.config.capabilities import not_implemented
from dockyard.config.loader import load_config
from dockyard.data.catalog import build_dataset
from dockyard.models import build_character_tokenizer
from dockyard.producers.dispatcher import Dispatcher
from dockyard.schemas import PromptGroup

SYNC = [
    "grpo.async_grpo.enabled=false",
    "loss_fn.use_importance_sampling_correction=false",
    "~loss_fn.truncated_importance_sampling_type",
    "~loss_fn.truncated_importance_sampling_ratio",
    "~loss_fn.truncated_importance_sampling_ratio_min",
    "grpo.num_prompts_per_step=6",
    "grpo.num_generations_per_prompt=2",
    "policy.train_global_batch_size=12",
    "policy.train_micro_batch_size=12",
    "data.train.params.num_samples=10",
]
EXTRAS = (
    "data.extra_train_dataloaders=["
    "{name: arithmetic, env: math, agent_name: second, params: {num_samples: 6, seed: 7}},"
    "{name: arithmetic, agent_name: third, params: {num_samples: 4, seed: 9}}]"
)


def config(*extra: str):
    return load_config("configs/quickstart.yaml", [*SYNC, EXTRAS, *extra])


def make(cfg, plane: MemoryPlane) -> Dispatcher:
    data = cfg.data
    return Dispatcher(
        cfg,
        MessagePlane(plane, stage="dispatcher"),
        build_dataset(data.train, data.default_env),
        build_character_tokenizer(),
        run_id="r",
        extra_datasets=[build_dataset(e, data.default_env) for e in data.extra_train_dataloaders],
    )


async def drain(plane: MemoryPlane) -> list[PromptGroup]:
    messages = MessagePlane(plane, stage="test")
    received = await messages.fetch(
        plane.names.prompt_consumer, PromptGroup, batch=1000, timeout_s=0.1
    )
    return [item.message for item in received]


def loader_of(group: PromptGroup) -> int:
    # r:e0:i3 is data.train's; r:l<k>:e0:i3 is extra loader k - 1's.
    part = group.group_id.split(":")[1]
    return int(part[1:]) if part.startswith("l") else 0


async def test_each_loader_gives_an_equal_share_in_turn_with_its_own_env_and_agent():
    cfg = config("grpo.max_num_epochs=100")
    assert not_implemented(cfg) == []  # no longer refused at launch (sync GRPO)
    async with MemoryPlane() as plane:
        dispatcher = make(cfg, plane)
        for _ in range(4):  # 4 sync steps of 6 prompts: 24 = 8 per loader
            await dispatcher.top_up(in_flight=0, weight_version=0)
        groups = await drain(plane)
    assert len(groups) == 24
    assert [loader_of(g) for g in groups] == [0, 1, 2] * 8  # round robin
    assert Counter(loader_of(g) for g in groups) == {0: 8, 1: 8, 2: 8}  # 1 / (1 + 2) each
    by_loader = {k: [g for g in groups if loader_of(g) == k] for k in range(3)}
    assert {(g.environment, g.agent) for g in by_loader[0]} == {("arithmetic", "arithmetic")}
    assert {(g.environment, g.agent) for g in by_loader[1]} == {("math", "second")}
    assert {(g.environment, g.agent) for g in by_loader[2]} == {("arithmetic", "third")}
    assert len({g.group_id for g in groups}) == 24  # equal positions of two loaders: two ids
    # Each loader walks whole epochs of its own data: the 4-record loader's first 8 prompts
    # are epoch 0 (positions 0-3) then epoch 1 (positions 0-3), each epoch a permutation.
    third = [(g.dataset_position.epoch, g.dataset_position.index) for g in by_loader[2]]
    assert third == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    for epoch in (0, 1):
        prompts = [g.prompt_text for g in by_loader[2] if g.dataset_position.epoch == epoch]
        assert len(set(prompts)) == 4


async def test_the_order_is_seeded_by_grpo_seed():
    async def prompts(seed: int) -> list[str]:
        async with MemoryPlane() as plane:
            dispatcher = make(config("grpo.max_num_epochs=100", f"grpo.seed={seed}"), plane)
            await dispatcher.top_up(0, 0)
            await dispatcher.top_up(0, 0)
            return [g.prompt_text for g in await drain(plane) if loader_of(g) == 1]

    assert await prompts(1) == await prompts(1)
    assert await prompts(1) != await prompts(2)


async def test_a_loader_that_has_done_its_epochs_leaves_the_turn_and_the_data_ends_after_all():
    cfg = config("grpo.max_num_epochs=1")
    async with MemoryPlane() as plane:
        dispatcher = make(cfg, plane)
        while not dispatcher.exhausted:
            await dispatcher.top_up(in_flight=0, weight_version=0)
        groups = await drain(plane)
    # One epoch each: 10 + 6 + 4 prompts; the 4-record loader drops out after 12 prompts, the
    # 6-record one after 17, then data.train alone.
    assert Counter(loader_of(g) for g in groups) == {0: 10, 1: 6, 2: 4}
    assert [loader_of(g) for g in groups] == [0, 1, 2] * 4 + [0, 1] * 2 + [0] * 4


async def test_a_resumed_dispatcher_continues_every_loader_where_it_stopped():
    cfg = config("grpo.max_num_epochs=100")
    async with MemoryPlane() as plane:
        straight = make(cfg, plane)
        whole = [*await straight.top_up(0, 0), *await straight.top_up(0, 0)]
        whole += await straight.top_up(0, 0)
    async with MemoryPlane() as plane:
        first = make(cfg, plane)
        head = await first.top_up(0, 0)
        saved = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
        assert saved["loaders"] == 3
        assert (saved["extra1.epoch"], saved["extra1.position"]) == (0, 2)  # 2 of its 4 taken
        resumed = make(cfg, plane)
        resumed.load_state_dict(saved)
        tail = [*await resumed.top_up(0, 0), *await resumed.top_up(0, 0)]
    assert head + tail == whole  # nothing dispatched twice, nothing skipped, same turn order


async def test_resuming_with_other_loaders_is_refused():
    cfg = config("grpo.max_num_epochs=100")
    async with MemoryPlane() as plane:
        first = make(cfg, plane)
        await first.top_up(0, 0)
        saved = first.state_dict()
        fewer = load_config("configs/quickstart.yaml", [*SYNC, "grpo.max_num_epochs=100"])
        with pytest.raises(ValueError, match="from 3 training dataloader"):
            make(fewer, plane).load_state_dict(saved)
        resized = config(
            "grpo.max_num_epochs=100", "data.extra_train_dataloaders.1.params.num_samples=5"
        )
        with pytest.raises(ValueError, match=r"data.extra_train_dataloaders.1\) is into a"):
            make(resized, plane).load_state_dict(saved)
    # A checkpoint from before several loaders (no "loaders" key) still resumes data.train.
    async with MemoryPlane() as plane:
        single = load_config("configs/quickstart.yaml", [*SYNC, "grpo.max_num_epochs=100"])
        old = {"epoch": 0, "position": 3, "dispatched": 3, "skipped_too_long": 0}
        dispatcher = make(single, plane)
        dispatcher.load_state_dict(old)
        assert dispatcher.loaders[0].at.position == 3


def test_the_launch_builds_every_extra_loader_and_names_a_bad_one_by_its_key():
    inputs = prepare_trainer(config())
    assert [len(d) for d in inputs.extra_datasets] == [6, 4]
    with pytest.raises(CliError, match=r"data\.extra_train_dataloaders\.1\.name: .*nosuch"):
        prepare_trainer(config("data.extra_train_dataloaders.1.name=nosuch"))
