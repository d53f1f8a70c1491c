"""The trainer's accounting of groups over a whole run: the real TrainerLoop, dispatcher and
in-memory plane (or a real nats-server); the rollout worker and scorer are replaced by a
stand-in that answers every prompt with a scored group at once (no model runs), stamped with a
chosen weight version."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from dockyard.broker.factory import create_data_plane
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.factory import create_weight_store
from dockyard.config.loader import load_config
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.consumers.trainer.ledger import read_trail
from dockyard.consumers.trainer.loop import TrainerLoop, open_trainer
from dockyard.data.catalog import build_dataset
from dockyard.producers.dispatcher import Dispatcher
from dockyard.schemas import PromptGroup, SampleScore, ScoredRollout
from tests.integration.roles.factories import TOKENIZER, rollout


def small_config(*overrides: str):
    return load_config(
        "configs/quickstart.yaml",
        [
            "sft.enabled=false",
            "grpo.val_at_start=false",
            "grpo.val_at_end=false",
            "grpo.val_period=0",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=2",
            "policy.train_global_batch_size=4",
            "policy.train_micro_batch_size=4",
            "run.starvation_warning_s=5",
            "run.starvation_timeout_s=30",
            "checkpointing.enabled=false",
            "~data_plane",
            *overrides,
        ],
    )


Stamps = Callable[[PromptGroup], list[tuple[str, float, float]]]
"""A group's samples' (worker id, generation started, finished), as a worker reports them."""


def answer(
    group: PromptGroup, version: int, stamps: Stamps | None = None, *, varied: bool = False
) -> ScoredRollout:
    """The right answer for every sample, every token stamped with ``version``; ``varied``:
    sample ``i`` answers the right sum plus ``i`` (identical samples with opposite advantages
    have gradients that cancel exactly, and a model trained on them never moves)."""
    answers = [
        str(int(group.ground_truth) + (i if varied else 0)) for i in range(group.num_generations)
    ]
    return ScoredRollout(
        rollout=rollout(group, answers, version=version, stamps=stamps(group) if stamps else None),
        scores=[SampleScore(sample_index=i, reward=float(i % 2)) for i in range(len(answers))],
        scorer_id="stand-in",
    )


async def answer_prompts(
    messages: MessagePlane,
    versions_behind: int,
    stamps: Stamps | None = None,
    *,
    varied: bool = False,
) -> None:
    """Stands in for a rollout worker (and scorer) that is ``versions_behind`` refits late."""
    while True:
        for item in await messages.fetch(
            messages.names.prompt_consumer, PromptGroup, batch=16, timeout_s=0.2
        ):
            group = item.message
            version = max(0, group.dispatch_weight_version - versions_behind)
            await messages.publish(answer(group, version, stamps, varied=varied))
            await item.ack()


@contextlib.asynccontextmanager
async def trainer(
    run_dir: Path,
    *overrides: str,
    versions_behind: int = 0,
    data_plane: DataPlaneConfig | None = None,
    stamps: Stamps | None = None,
    varied: bool = False,
) -> AsyncIterator:
    """The first incarnation of a trainer, on the in-memory plane unless ``data_plane``
    (``varied``: see :func:`answer`)."""
    config = small_config(*overrides)
    async with create_data_plane(data_plane, client_name="trainer") as plane:
        messages = MessagePlane(plane, stage="trainer")
        dataset = build_dataset(config.data.train, config.data.default_env)
        dispatcher = Dispatcher(config, messages, dataset, TOKENIZER, run_id="acct")
        loop = await open_trainer(config, messages, create_weight_store(plane), run_dir, dispatcher)
        stand_in = asyncio.create_task(
            answer_prompts(messages, versions_behind, stamps, varied=varied)
        )
        try:
            yield loop
        finally:
            stand_in.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stand_in


async def next_incarnation(first: TrainerLoop, run_dir: Path, *overrides: str) -> TrainerLoop:
    """A new trainer on the same plane and run directory as ``first`` (as after a restart)."""
    config = small_config(*overrides)
    dataset = build_dataset(config.data.train, config.data.default_env)
    dispatcher = Dispatcher(config, first.messages, dataset, TOKENIZER, run_id="acct")
    return await open_trainer(
        config, first.messages, create_weight_store(first.plane), run_dir, dispatcher
    )


def step_metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r["metrics"] for r in records if "staleness/max" in r["metrics"]]


def settled(run_dir: Path) -> tuple[list[str], dict[str, int], dict[str, str]]:
    events = read_trail(run_dir / "ledger.jsonl")
    dispatched = [e["group_id"] for e in events if e["event"] == "dispatched"]
    trained = {e["group_id"]: e["step"] for e in events if e["event"] == "trained"}
    dropped = {e["group_id"]: e["reason"] for e in events if e["event"] == "dropped"}
    return dispatched, trained, dropped


async def test_no_group_is_trained_older_than_the_age_limit_however_long_it_waited(tmp_path):
    # Workers one refit late: groups come in at age 1 (accepted), and those that wait in the
    # buffer for a step would be trained at age 2.
    async with trainer(
        tmp_path,
        "grpo.max_num_steps=6",
        "grpo.async_grpo.max_trajectory_age_steps=1",
        versions_behind=1,
    ) as loop:
        await loop.run()
    staleness = [m["staleness/max"] for m in step_metrics(tmp_path)]
    assert len(staleness) == 6 and max(staleness) <= 1
    _, trained, dropped = settled(tmp_path)
    assert dropped and all(reason == "stale: age 2 > 1" for reason in dropped.values())
    assert loop.summary.dropped_stale == len(dropped)
    assert not set(trained) & set(dropped)


async def test_a_used_up_dataset_ends_the_run_and_drops_what_cannot_fill_a_step(tmp_path):
    # 5 prompts, 2 per step, one epoch: 2 steps, then 1 group that can never fill a step.
    async with trainer(
        tmp_path,
        "grpo.max_num_steps=100",
        "grpo.max_num_epochs=1",
        "data.train.params.num_samples=5",
        "grpo.val_at_end=true",
    ) as loop:
        summary = await loop.run()  # returns: no starvation error
    assert summary.steps == 2
    dispatched, trained, dropped = settled(tmp_path)
    assert len(dispatched) == 5 and len(trained) == 4
    assert list(dropped.values()) == ["dataset exhausted: 1 groups left, fewer than a step's 2"]
    assert loop.ledger.in_flight == 0 and loop.pending == []


async def test_groups_settled_by_replay_before_being_dispatched_do_not_inflate_the_budget(
    tmp_path,
):
    # A second incarnation without a checkpoint replays the first one's scored groups (and
    # settles them) before its dispatcher re-issues their ids.
    async with trainer(tmp_path, "grpo.max_num_steps=3") as first:
        await first.run()
        second = await next_incarnation(first, tmp_path, "grpo.max_num_steps=6")
        dispatcher = second.prompt_source
        budgets: list[int] = []
        original = dispatcher.top_up

        async def top_up(in_flight: int, weight_version: int) -> list[str]:
            budgets.append(in_flight)
            return await original(in_flight, weight_version)

        dispatcher.top_up = top_up  # type: ignore[method-assign]
        await second.run()
    assert min(budgets) >= 0
    _, trained, _ = settled(tmp_path)
    assert len(trained) == len(set(trained))


async def test_a_clean_resume_trains_the_groups_left_over_instead_of_dropping_them(tmp_path):
    checkpointed = ("checkpointing.enabled=true", "checkpointing.save_period=1")
    age_limit = "grpo.async_grpo.max_trajectory_age_steps=1"
    async with trainer(tmp_path, "grpo.max_num_steps=3", age_limit, *checkpointed) as first:
        await first.run()
        assert first.pending or first.ledger.in_flight  # work left over for the next one
        second = await next_incarnation(
            first, tmp_path, "grpo.max_num_steps=6", age_limit, *checkpointed
        )
        await second.run()
    assert second.step == 6
    _, trained, dropped = settled(tmp_path)
    assert len(trained) == 6 * 2
    assert dropped == {}  # the checkpoint's weights came back as a new version, not older ones
    assert max(m["staleness/max"] for m in step_metrics(tmp_path)) <= 1


async def test_a_dead_lettered_group_is_dropped_with_the_reason_not_left_open(tmp_path):
    async with trainer(tmp_path, "grpo.max_num_steps=3") as loop:
        # The stand-in also answers one group with bytes no decoder accepts (a corrupt frame):
        # the trainer's fetch dead-letters it, and the trainer must let go of that group.
        poisoned: list[str] = []
        plane = loop.plane
        publish = loop.messages.publish

        async def publish_poison_once(message):
            if isinstance(message, ScoredRollout) and not poisoned:
                poisoned.append(message.group_id)
                await plane.publish(plane.names.scored, b"not a frame", msg_id=message.message_id())
                return None
            return await publish(message)

        loop.messages.publish = publish_poison_once  # type: ignore[method-assign]
        await loop.run()
    [group_id] = poisoned
    _, trained, dropped = settled(tmp_path)
    assert group_id not in trained
    assert dropped[group_id] == "dead letter from trainer: corrupt_frame"


def trained_by_step(run_dir: Path) -> dict[int, set[str]]:
    steps: dict[int, set[str]] = {}
    for group_id, step in settled(run_dir)[1].items():
        steps.setdefault(step, set()).add(group_id)
    return steps


async def test_lost_steps_are_retrained_from_exactly_the_groups_they_used(
    tmp_path, data_plane_config
):
    # Workers one refit late and an age limit of 1: every group of a step is one or two
    # versions old when trained. The trainer dies after step 15 with its checkpoint at step 10.
    async_on = ("grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1")
    checkpoints = ("checkpointing.enabled=true", "checkpointing.save_period=10")
    checkpoints += ("checkpointing.keep_top_k=null",)
    run = ("grpo.max_num_steps=15", *async_on, *checkpoints)
    async with trainer(tmp_path, *run, versions_behind=1, data_plane=data_plane_config) as first:
        await first.run()
        # The crash: nothing after step 10 was saved (the run's final save never happened).
        shutil.rmtree(tmp_path / "checkpoints" / "step_15")
        original = trained_by_step(tmp_path)
        second = await next_incarnation(first, tmp_path, *run)
        await second.run()
    assert second.step == 15
    retrained = trained_by_step(tmp_path)
    lost_steps = range(11, 16)
    for step in lost_steps:
        assert retrained[step] == original[step], f"step {step}"
    _, _, dropped = settled(tmp_path)
    lost_groups = set().union(*(original[step] for step in lost_steps))
    assert not {g: dropped[g] for g in lost_groups if g in dropped}
