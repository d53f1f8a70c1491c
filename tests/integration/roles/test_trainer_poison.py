"""The trainer over a scored stream that holds a poison header (issue #17): the real TrainerLoop
on JetStream; the rollout worker and scorer are the accounting tests' stand-in."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from structlog.testing import capture_logs

from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import PLANE_STAGE, PublishAck
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.factory import create_weight_store
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.consumers.trainer.loop import TrainerLoop, open_trainer
from dockyard.data.catalog import build_dataset
from dockyard.producers.dispatcher import Dispatcher
from dockyard.schemas import Message, ScoredRollout
from tests.integration.broker.broker_test_utils import collect
from tests.integration.broker.poison_headers import CORPUS, publish_poison
from tests.integration.roles.factories import TOKENIZER
from tests.unit.trainer.test_trainer_accounting import answer_prompts, small_config


async def test_the_trainer_dead_letters_a_poison_header_once_and_resumes_past_it(
    tmp_path: Path,
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> None:
    async with JetStreamPlane(data_plane_config_factory(nats_server.url)) as plane:
        messages = MessagePlane(plane, stage="trainer")

        async def trainer(steps: int, run_id: str) -> TrainerLoop:
            config = small_config(f"grpo.max_num_steps={steps}")
            dataset = build_dataset(config.data.train, config.data.default_env)
            dispatcher = Dispatcher(config, messages, dataset, TOKENIZER, run_id=run_id)
            return await open_trainer(
                config, messages, create_weight_store(plane), tmp_path, dispatcher
            )

        # The first scored group goes out with the header: a non-numeric chunk count.
        poisoned: list[PublishAck] = []
        publish = messages.publish

        async def publish_poison_once(message: Message) -> PublishAck:
            if isinstance(message, ScoredRollout) and not poisoned:
                ack = await publish_poison(
                    plane, plane.names.scored, message, CORPUS[0], message.message_id()
                )
                poisoned.append(ack)
                return ack
            return await publish(message)

        messages.publish = publish_poison_once  # type: ignore[method-assign]
        stand_in = asyncio.create_task(answer_prompts(messages, versions_behind=0))
        try:
            first = await trainer(3, "first")
            await first.run()
            assert first.step == 3
            # Restarted without a checkpoint, the trainer replays the scored stream from its
            # start, over the poison (a new run id: the first one's prompts are still within
            # the dedupe window).
            with capture_logs() as events:
                second = await trainer(6, "second")
                await second.run()
            assert second.step == 6
        finally:
            stand_in.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stand_in
        letters = [read_dead_letter(m) for m in await collect(plane, plane.names.dead_letters)]

    [poison] = poisoned
    [letter] = [item for item in letters if item.original_stream_seq == poison.seq]
    assert (letter.stage, letter.reason) == (PLANE_STAGE, "bad_header")
    # The resume passed over it without refusing it a second time.
    skipped = [e for e in events if e["event"] == "trainer.replay_skipped"]
    assert [e["seq"] for e in skipped] == [poison.seq]
    assert not [e for e in events if e["event"] == "message.dead_lettered"]
