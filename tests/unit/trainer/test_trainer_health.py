"""The trainer says which stage starves it instead of waiting silently, then ends the run."""

from __future__ import annotations

import pytest

from dockyard.broker.memory import MemoryPlane
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weights.factory import create_weight_store
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.health import PipelineDiagnosis
from dockyard.consumers.trainer.loop import TrainerLoop, TrainerStarved
from dockyard.data.base import build_dataset
from dockyard.models import build_character_tokenizer
from dockyard.producers.dispatcher import Dispatcher


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
        loop = TrainerLoop(config, messages, create_weight_store(plane), tmp_path, dispatcher)
        with pytest.raises(TrainerStarved, match="rollout workers") as error:
            await loop.run()
        assert "prompts waiting 4" in str(error.value)
