"""The trainer says which stage starves it instead of waiting silently, then ends the run; a
role that reports itself starting (its heartbeat) is waited for, not counted as starving it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.memory import MemoryPlane
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.factory import create_weight_store
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.health import PipelineDiagnosis
from dockyard.consumers.trainer.loop import TrainerLoop, TrainerStarved, open_trainer
from dockyard.data.catalog import build_dataset
from dockyard.models import build_character_tokenizer
from dockyard.observability.status_files import STARTING, StatusFile
from dockyard.producers.dispatcher import Dispatcher
from tests.integration.roles.test_rollout_worker import wait_for
from tests.unit.trainer.test_trainer_accounting import answer_prompts, small_config

STARVATION_TIMEOUT_S = 2.0
FAST_STARVATION = (
    "run.starvation_warning_s=0.5",
    f"run.starvation_timeout_s={STARVATION_TIMEOUT_S}",
)


@pytest.mark.parametrize(
    ("diagnosis", "stage"),
    [
        (PipelineDiagnosis(0, 0, 3, 0), "trainer"),
        (PipelineDiagnosis(5, 2, 0, 0), "scorers"),
        (PipelineDiagnosis(5, 0, 0, 1), "rollout workers"),
        (PipelineDiagnosis(0, 0, 0, 4), "dead letters"),
        (PipelineDiagnosis(0, 0, 0, 0), "dispatcher"),
    ],
)
def test_the_starving_stage_is_named(diagnosis, stage):
    assert diagnosis.starving_stage.startswith(stage)
    assert diagnosis.nothing_in_flight == (stage in ("dead letters", "dispatcher"))


def test_a_full_stream_is_named_as_the_cause_not_the_dispatcher():
    # Issue 44: with the experience stream full the diagnosis blamed the dispatcher.
    full = "stream NS_experience is full (3.7 KiB of its max_bytes 4 KiB, 93%)"
    diagnosis = PipelineDiagnosis(0, 0, 0, 0, full_streams=(full,))
    assert diagnosis.describe().startswith(f"starving: {full}")
    assert "dispatcher" not in diagnosis.starving_stage
    # Its publishers hold the groups they could not store: not lost, so none is dropped.
    assert not diagnosis.nothing_in_flight


async def test_no_rollout_workers_ends_the_run_with_the_diagnosis(tmp_path):
    config = load_config(
        "configs/quickstart.yaml",
        [
            "sft.enabled=false",
            "grpo.val_at_start=false",
            "grpo.num_prompts_per_step=2",
            "grpo.num_generations_per_prompt=2",
            "policy.train_global_batch_size=4",
            "policy.train_micro_batch_size=4",
            "run.starvation_warning_s=0.5",
            "run.starvation_timeout_s=2",
            "~data_plane",
        ],
    )
    async with MemoryPlane() as plane:
        messages = MessagePlane(plane, stage="trainer")
        dispatcher = Dispatcher(
            config,
            messages,
            build_dataset(config.data.train, config.data.default_env),
            build_character_tokenizer(),
            run_id="starving",
        )
        loop = await open_trainer(
            config, messages, create_weight_store(plane), tmp_path, dispatcher
        )
        with pytest.raises(TrainerStarved, match="rollout workers") as error:
            await loop.run()
        assert "prompts waiting 4" in str(error.value)


@contextlib.asynccontextmanager
async def trainer_in_a_fleet(
    run_dir: Path, data_plane_config, *overrides: str
) -> AsyncIterator[tuple[TrainerLoop, MessagePlane, Path]]:
    """A trainer on a real nats-server that writes its heartbeat where the fleet's roles write
    theirs (``dockyard run``'s status directory)."""
    config = small_config(*FAST_STARVATION, *overrides)
    status_dir = run_dir / "status"
    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="trainer")
        dataset = build_dataset(config.data.train, config.data.default_env)
        dispatcher = Dispatcher(config, messages, dataset, build_character_tokenizer(), run_id="h")
        status = StatusFile(status_dir, "trainer", "0")
        loop = await open_trainer(
            config, messages, create_weight_store(plane), run_dir, dispatcher, status=status
        )
        yield loop, messages, status_dir


@pytest.mark.slow
async def test_a_worker_starting_past_the_starvation_timeout_is_waited_for_and_named(
    tmp_path, data_plane_config
):
    async with trainer_in_a_fleet(tmp_path, data_plane_config, "grpo.max_num_steps=2") as (
        loop,
        messages,
        status_dir,
    ):
        heartbeat = StatusFile(status_dir, "rollout", "0")
        heartbeat.update(STARTING, detail="loading the engine")

        async def slow_worker(events: list[dict]) -> None:
            # It stays starting until the trainer has waited on it for twice the starvation
            # timeout (a slow engine load), then becomes ready and answers every prompt.
            async def waited_long() -> bool:
                return any(
                    e["event"] == "trainer.waiting_for_roles"
                    and e["waited_s"] >= 2 * STARVATION_TIMEOUT_S
                    for e in events
                )

            await wait_for(waited_long)
            heartbeat.update("running", detail="")
            await answer_prompts(messages, versions_behind=0)

        with capture_logs() as events:
            worker = asyncio.create_task(slow_worker(events))
            try:
                summary = await loop.run()  # no TrainerStarved
            finally:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
    assert summary.steps == 2
    waiting = [e for e in events if e["event"] == "trainer.waiting_for_roles"]
    assert waiting and all(e["starting"] == ["rollout-0"] for e in waiting)
    assert not [e for e in events if e["event"] == "trainer.starving"]


async def test_a_ready_but_silent_fleet_still_ends_the_run_after_the_timeout(
    tmp_path, data_plane_config
):
    async with trainer_in_a_fleet(tmp_path, data_plane_config) as (loop, _, status_dir):
        for role in ("rollout", "scorer"):
            StatusFile(status_dir, role, "0").update("running")
        with pytest.raises(TrainerStarved) as error:
            await loop.run()
    message = str(error.value)
    assert "still starting: none; ready but silent: rollout-0, scorer-0" in message
    assert "rollout workers" in message  # and which stage starves


async def test_a_worker_that_never_gets_ready_ends_the_run_after_the_role_start_timeout(
    tmp_path, data_plane_config
):
    async with trainer_in_a_fleet(tmp_path, data_plane_config, "run.role_start_timeout_s=4") as (
        loop,
        _,
        status_dir,
    ):
        StatusFile(status_dir, "rollout", "0").update(STARTING)
        StatusFile(status_dir, "scorer", "0").update("running")
        with pytest.raises(TrainerStarved) as error:
            await loop.run()
    message = str(error.value)
    assert "roles still starting after run.role_start_timeout_s=4" in message
    assert "still starting: rollout-0; ready but silent: scorer-0" in message
