"""``fields.images``: a file dataset's records name image files; they travel with the prompt
group, and the prompt shows one image placeholder per file before its text (the chat template's
rendering of image content parts)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from dockyard.config.sections.data import DatasetConfig
from dockyard.data.base import DatasetError
from dockyard.data.catalog import build_dataset
from dockyard.data.chat import PromptFormat, render_prompt
from dockyard.models import load_tokenizer
from dockyard.producers.prompts import make_prompt_group

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
TWO_IMAGES = {"prompt": "which?", "answer": "red", "images": ["a.png", "b.png"]}


def dataset(tmp_path, records: list[dict[str, object]]):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    config = DatasetConfig(name="d", path=str(path), fields={"images": "images"})
    return build_dataset(config, "hle")


def square(tmp_path, name: str) -> bytes:
    Image.new("RGB", (30, 20), (200, 0, 0)).save(tmp_path / name)
    return (tmp_path / name).read_bytes()


def test_the_named_files_travel_with_the_prompt_group(tmp_path):
    one, two = square(tmp_path, "a.png"), square(tmp_path, "b.png")
    records = dataset(
        tmp_path, [{"prompt": "which?", "answer": "red", "images": ["a.png", "b.png"]}]
    )
    assert records[0].images == (one, two)
    tokenizer = load_tokenizer("tiny://qwen2-vl-bpe")
    group = make_prompt_group(
        records[0],
        tokenizer,
        run_id="r",
        dataset_name="d",
        epoch=0,
        position=0,
        num_generations=2,
        weight_version=0,
    )
    assert group.images == [one, two]


def test_the_prompt_shows_one_placeholder_per_image_before_its_text(tmp_path):
    square(tmp_path, "a.png")
    square(tmp_path, "b.png")
    [record] = [
        dataset(tmp_path, [{"prompt": "which?", "answer": "x", "images": ["a.png", "b.png"]}])[0]
    ]
    text = render_prompt(record, PromptFormat(), load_tokenizer("tiny://qwen2-vl-bpe"))
    assert text.endswith(
        f"<|im_start|>user\n{PLACEHOLDER}{PLACEHOLDER}which?<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("images", "message"),
    [("a.png", "is not a list of image file paths"), (["missing.png"], "cannot read")],
)
def test_a_bad_images_field_is_refused_naming_the_record_and_the_key(tmp_path, images, message):
    with pytest.raises(DatasetError, match=message) as caught:
        dataset(tmp_path, [{"prompt": "p", "answer": "a", "images": images}])
    assert caught.value.key == "fields.images"
    assert f"of {tmp_path / 'd.jsonl'}" in str(caught.value)
