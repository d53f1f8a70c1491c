"""Before a step, a group whose token ids and images disagree is found (and, by the screen,
dead-lettered) instead of stopping the step: wrong run lengths, an image without a placeholder,
placeholders without an image, and a file that is not a PNG."""

from __future__ import annotations

import re

import pytest
from PIL import Image

from dockyard.consumers.trainer.image_screen import image_mismatch
from dockyard.models import load_processor
from dockyard.models.vision import encode_png, expanded_placeholder_ids
from tests.unit.trainer.test_batch_and_step import scored_group

MAX_PIXELS = 1_000_000


@pytest.fixture(scope="module")
def processor():
    loaded = load_processor("tiny://qwen2-vl-bpe")
    assert loaded is not None
    return loaded


def test_a_group_whose_runs_match_its_images_passes(processor):
    image = Image.new("RGB", (100, 60))  # 8 placeholders
    [run] = expanded_placeholder_ids(processor, [image])
    group = scored_group("ok", [5, *run, 6], [[7, 8]], [1.0], [encode_png(image)])
    assert image_mismatch(group, processor, max_pixels=MAX_PIXELS) is None


def test_a_text_group_passes(processor):
    assert image_mismatch(scored_group("t", [5, 6], [[7]], [1.0]), processor, max_pixels=9) is None


@pytest.mark.parametrize(
    ("placeholders", "images", "why"),
    [
        (4, [(100, 60)], r"sample 0: placeholder runs \[4\] do not match .* \[8\]"),
        (0, [(56, 56)], r"sample 0: placeholder runs \[\] do not match .* \[4\]"),
        (4, [], "sample 0: 1 image placeholder run"),
    ],
)
def test_ids_and_images_that_disagree_are_named(processor, placeholders, images, why):
    pad = processor.image_token_id
    files = [encode_png(Image.new("RGB", size)) for size in images]
    group = scored_group("bad", [5, *[pad] * placeholders, 6], [[7]], [1.0], files)
    found = image_mismatch(group, processor, max_pixels=MAX_PIXELS)
    assert found is not None and re.search(why, found), found


def test_an_image_over_the_pixel_cap_is_refused_before_decoding(processor):
    image = Image.new("RGB", (100, 60))
    [run] = expanded_placeholder_ids(processor, [image])
    group = scored_group("big", [5, *run], [[7]], [1.0], [encode_png(image)])
    why = image_mismatch(group, processor, max_pixels=100 * 60 - 1)
    assert why is not None and "over policy.generation.max_image_pixels" in why
