"""The trainer's image screen on a real nats-server: a scored group whose token ids and images
disagree is dead-lettered (``image_placeholder_mismatch``, stage trainer, with the sample and the
reason) and dropped from the ledger; the group beside it, whose ids match, stays for the step."""

from __future__ import annotations

from PIL import Image

from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.consumers.trainer.image_screen import ImageScreen
from dockyard.consumers.trainer.intake import Pending
from dockyard.consumers.trainer.ledger import Ledger, read_trail
from dockyard.models import load_processor
from dockyard.models.vision import encode_png, expanded_placeholder_ids
from dockyard.schemas import encode
from tests.integration.broker.broker_test_utils import collect
from tests.unit.trainer.test_batch_and_step import scored_group


async def test_a_group_whose_ids_and_images_disagree_is_dead_lettered(data_plane_config, tmp_path):
    processor = load_processor("tiny://qwen2-vl-bpe")
    assert processor is not None
    image = Image.new("RGB", (100, 60))  # 8 placeholders
    [run] = expanded_placeholder_ids(processor, [image])
    good = scored_group("good", [5, *run, 6], [[7]], [1.0], [encode_png(image)])
    bad = scored_group("bad", [5, *run[:4], 6], [[7]], [1.0], [encode_png(image)])
    async with JetStreamPlane(data_plane_config) as plane:
        pending = []
        for group in (good, bad):
            encoded = encode(group)
            ack = await plane.publish(
                plane.names.scored,
                encoded.payload,
                msg_id=encoded.message_id,
                headers=encoded.headers,
            )
            pending.append(Pending(group, ack.seq, 0.0))
        ledger = Ledger(trail=tmp_path / "ledger.jsonl")
        screen = ImageScreen(processor, 1_000_000, plane, lambda: ledger)

        kept = await screen.screen(pending)

        assert [item.scored.group_id for item in kept] == ["good"]
        [letter] = [read_dead_letter(m) for m in await collect(plane, plane.names.dead_letters)]
    assert (letter.reason, letter.stage) == ("image_placeholder_mismatch", "trainer")
    assert "sample 0: placeholder runs [4] do not match the images' expanded sizes [8]" in (
        letter.message
    )
    drops = [e for e in read_trail(tmp_path / "ledger.jsonl") if e["event"] == "dropped"]
    assert [e["group_id"] for e in drops] == ["bad"]
    assert drops[0]["reason"].startswith("image_placeholder_mismatch: sample 0")
