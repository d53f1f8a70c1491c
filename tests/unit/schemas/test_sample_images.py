"""``RolloutSample.images`` (``rollout`` / ``scored_rollout`` 3.2, docs/wire-format.md): the PNG
files a sample's model attended to, one per placeholder run. A minor bump: 3.1 frames (no such
column) still decode, every sample with no image; anything but a PNG is refused
``invalid_field``, and the column is bounded like ``PromptGroup.images``."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image
from schema_factories import craft, make_prompt_group, make_sample, unpack_payload

from dockyard.schemas import (
    CodecError,
    ReasonCode,
    Rollout,
    ScoredRollout,
    decode,
    encode,
)
from dockyard.schemas.errors import WireError
from dockyard.schemas.prompt import MAX_INLINE_IMAGES
from dockyard.schemas.scored import SampleScore


def png(colour: tuple[int, int, int], size: tuple[int, int] = (8, 6)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


RED, BLUE = png((255, 0, 0)), png((0, 0, 255), (5, 5))


def rollout_with(*images: list[bytes]) -> Rollout:
    samples = [make_sample(index, images=list(own)) for index, own in enumerate(images)]
    return Rollout(group=make_prompt_group(num_generations=len(images)), samples=samples)


def envelope_of(message: Rollout | ScoredRollout) -> dict[str, Any]:
    envelope = unpack_payload(encode(message).payload)
    assert envelope["schema_version"] == "3.2"
    return envelope


def test_images_round_trip_per_sample_in_order():
    message = rollout_with([RED, BLUE], [], [BLUE])
    samples = envelope_of(message)["meta"]["samples"]
    assert samples["images"] == [[RED, BLUE], [], [BLUE]]  # msgpack bin, one list per sample
    decoded = decode(None, encode(message).payload, expected=Rollout)
    assert decoded == message
    assert [sample.images for sample in decoded.samples] == [[RED, BLUE], [], [BLUE]]
    with Image.open(io.BytesIO(decoded.samples[0].images[1])) as image:
        assert image.size == (5, 5) and image.getpixel((0, 0)) == (0, 0, 255)


def test_a_scored_rollout_carries_its_samples_images():
    rollout = rollout_with([RED], [])
    scores = [SampleScore(sample_index=i, reward=float(i)) for i in range(2)]
    scored = ScoredRollout(rollout=rollout, scores=scores, scorer_id="s")
    assert envelope_of(scored)["meta"]["rollout"]["samples"]["images"] == [[RED], []]
    decoded = decode(None, encode(scored).payload, expected=ScoredRollout)
    assert decoded == scored
    assert decoded.rollout.samples[0].images == [RED]


@pytest.mark.parametrize("schema", ["rollout", "scored_rollout"])
def test_a_3_1_message_without_the_column_decodes_with_no_images(schema: str):
    rollout = rollout_with([], [])
    message: Rollout | ScoredRollout = rollout
    if schema == "scored_rollout":
        scores = [SampleScore(sample_index=i, reward=0.0) for i in range(2)]
        message = ScoredRollout(rollout=rollout, scores=scores, scorer_id="s")
    envelope = envelope_of(message)
    meta = envelope["meta"]
    columns = meta["samples"] if schema == "rollout" else meta["rollout"]["samples"]
    del columns["images"]
    payload = craft(meta, schema=schema, version="3.1", data=envelope["data"])
    decoded = decode(None, payload)
    assert decoded == message
    samples = decoded.samples if isinstance(decoded, Rollout) else decoded.rollout.samples
    assert [sample.images for sample in samples] == [[], []]


def test_an_image_that_is_not_a_png_is_refused_on_the_wire_and_in_python():
    jpeg = io.BytesIO()
    Image.new("RGB", (4, 4)).save(jpeg, format="JPEG")
    envelope = envelope_of(rollout_with([RED], []))
    envelope["meta"]["samples"]["images"][0][0] = jpeg.getvalue()
    payload = craft(envelope["meta"], schema="rollout", version="3.2", data=envelope["data"])
    with pytest.raises(CodecError) as caught:
        decode(None, payload)
    assert caught.value.reason is ReasonCode.INVALID_FIELD
    assert "samples.images.0[0] is not a PNG" in caught.value.detail
    with pytest.raises(WireError, match="not a PNG"):
        make_sample(0, images=[jpeg.getvalue()])


def _more_images_than_allowed(images: list[list[Any]]) -> None:
    images[0] = [RED] * (MAX_INLINE_IMAGES + 1)  # the bound of PromptGroup.images


def _not_bytes(images: list[list[Any]]) -> None:
    images[0] = ["not bytes"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda images: images.append([]), ReasonCode.LENGTH_MISMATCH),  # 3 lists, 2 samples
        (_more_images_than_allowed, ReasonCode.INVALID_FIELD),
        (_not_bytes, ReasonCode.WRONG_TYPE),
    ],
)
def test_a_malformed_images_column_is_refused(change, reason):
    envelope = envelope_of(rollout_with([RED], []))
    change(envelope["meta"]["samples"]["images"])
    payload = craft(envelope["meta"], schema="rollout", version="3.2", data=envelope["data"])
    with pytest.raises(CodecError) as caught:
        decode(None, payload)
    assert caught.value.reason is reason
