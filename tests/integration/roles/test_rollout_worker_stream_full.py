"""A rollout worker facing a full experience stream keeps its groups and its health (issue 44).

The stream refuses new messages when full; the worker's publish waits for room
(``publish.full_stream_wait_s``) and then fails with ``StreamFull``. That is no engine failure:
the groups go back to the queue and the worker, still healthy, names the stream on its status.
"""

from __future__ import annotations

from dockyard.broker.plane import StreamFull
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.models import build_arithmetic_policy
from tests.conftest import make_data_plane_config
from tests.integration.roles.factories import prompt_group
from tests.integration.roles.test_rollout_worker import (
    _has_rollouts,
    engine_over,
    rollouts,
    running_worker,
    wait_for,
    with_weights,
)

KiB = 1024


def tight_config(url: str) -> DataPlaneConfig:
    return make_data_plane_config(
        url, streams={"max_bytes": 16 * KiB}, publish={"full_stream_wait_s": 0.3}
    )


async def test_a_full_stream_sends_the_groups_back_and_the_worker_stays_healthy(nats_server):
    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(model, tokenizer)
    config = tight_config(nats_server.url)
    async with with_weights(config, model.state_dict()) as (plane, messages, store):
        names = plane.names
        # Scored groups the trainer has not read fill the stream.
        filled = 0
        try:
            while True:
                await plane.publish(names.scored, b"x" * KiB, msg_id=f"filler-{filled}")
                filled += 1
        except StreamFull:
            pass
        await messages.publish(prompt_group("g-full"))
        async with running_worker(
            plane, store, engine, nak_delay_s=0.05, max_consecutive_failures=1
        ) as worker:

            async def sent_back() -> bool:
                return (await plane.consumer_lag(names.prompt_consumer)).redelivered > 0

            await wait_for(sent_back)
            assert worker.failures == 0  # not counted against the engine
            assert f"stream {names.experience_stream.name} is full" in worker.status.status.detail
            # Room comes (the trainer read the filler and trimmed it): the group goes through.
            await plane.trim_history(names.scored, filled + 1)
            await wait_for(lambda: _has_rollouts(plane, 1))
        assert [r.group_id for r in await rollouts(plane)] == ["g-full"]
