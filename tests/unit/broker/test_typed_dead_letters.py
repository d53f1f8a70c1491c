"""The typed layer when a poison message cannot even be dead-lettered (the dead-letter publish
fails): nothing is lost, the batch's good messages still reach the role, and the poison comes
back later to be dead-lettered then."""

from __future__ import annotations

from prometheus_client import REGISTRY

from dockyard.broker.memory import MemoryPlane
from dockyard.broker.plane import PublishError
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import PromptGroup, encode
from tests.unit.schemas.schema_factories import make_prompt_group


async def test_a_failed_dead_letter_publish_keeps_the_poison_for_later(monkeypatch):
    monkeypatch.setattr("dockyard.broker.plane.DEAD_LETTER_RETRY_S", 0.0)
    config = DataPlaneConfig(consumer={"ack_wait_s": 30})
    async with MemoryPlane(config) as plane:
        messages = MessagePlane(plane, stage="rollout")
        names = plane.names
        await plane.publish(names.prompts, b"not a frame", msg_id="poison")
        good = make_prompt_group()
        encoded = encode(good)
        await plane.publish(names.prompts, encoded.payload, msg_id="good", headers={})
        dead_letter = plane.dead_letter
        refusals = [PublishError("stand-in: the dead-letter stream refused the publish")]

        async def refuse_once(*args, **kwargs):  # stands in for a broker refusing once
            if refusals:
                raise refusals.pop()
            return await dead_letter(*args, **kwargs)

        monkeypatch.setattr(plane, "dead_letter", refuse_once)
        first = await messages.fetch(names.prompt_consumer, PromptGroup, timeout_s=1)
        assert [item.message.group_id for item in first] == [good.group_id]
        assert sum(messages.dead_lettered.values()) == 0
        await first[0].ack()

        assert await messages.fetch(names.prompt_consumer, PromptGroup, timeout_s=1) == []
        assert messages.dead_lettered == {"corrupt_frame": 1}  # refused again, letter sent
        letters = [m async for m in plane.replay(names.dead_letters)]
        assert len(letters) == 1


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_the_metrics_count_what_went_in_out_and_to_the_dead_letters():
    names_and_labels = [
        ("dockyard_messages_published_total", {"stage": "trainer", "type": "PromptGroup"}),
        ("dockyard_messages_received_total", {"stage": "rollout", "type": "PromptGroup"}),
        ("dockyard_decode_failures_total", {"stage": "rollout", "reason": "corrupt_frame"}),
        ("dockyard_dead_letters_total", {"stage": "rollout", "reason": "corrupt_frame"}),
    ]
    before = [sample(name, **labels) for name, labels in names_and_labels]
    async with MemoryPlane(DataPlaneConfig()) as plane:
        names = plane.names
        dispatcher = MessagePlane(plane, stage="trainer")
        worker = MessagePlane(plane, stage="rollout")
        await plane.publish(names.prompts, b"not a frame", msg_id="poison")
        await dispatcher.publish_many([make_prompt_group(group_id=f"g{i}") for i in range(3)])
        received = await worker.fetch(names.prompt_consumer, PromptGroup, batch=8, timeout_s=1)
        assert len(received) == 3
    after = [sample(name, **labels) for name, labels in names_and_labels]
    # 3 groups out of the dispatcher and into the worker; the poison failed once, went once.
    assert [b - a for a, b in zip(before, after, strict=True)] == [3, 3, 1, 1]
