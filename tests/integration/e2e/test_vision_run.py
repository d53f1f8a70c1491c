"""A vision-language run under `dockyard run`: a JSONL dataset whose records name image files
("which colour is the square?"), the tiny Qwen2-VL on the torch engine, a real nats-server
broker, the hle exact-answer scorer. Every group is trained exactly once, and every training
step fed its samples' images to the model (none was trained as text)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps

pytestmark = pytest.mark.slow

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def write_dataset(directory: Path, records: int) -> Path:
    """``records`` prompts, each with one PNG of a coloured square (sizes vary, so the images
    expand to different numbers of placeholders)."""
    lines = []
    for index in range(records):
        name, rgb = list(COLOURS.items())[index % len(COLOURS)]
        width, height = 56 + 28 * (index % 3), 56 + 14 * (index % 2)
        image = Image.new("RGB", (width, height), (255, 255, 255))
        image.paste(rgb, (width // 4, height // 4, 3 * width // 4, 3 * height // 4))
        image.save(directory / f"square-{index}.png")
        record = {"prompt": "Which colour is the square?", "answer": name}
        lines.append(json.dumps({**record, "images": [f"square-{index}.png"]}))
    path = directory / "colours.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_image_prompt_run_trains_every_group_once_with_its_images(tmp_path):
    data = write_dataset(tmp_path, records=12)
    run_dir = tmp_path / "run"
    result = run_dockyard(
        "run",
        "--config",
        str(QUICKSTART),
        "sft.enabled=false",
        "grpo.num_prompts_per_step=2",
        "grpo.num_generations_per_prompt=2",
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        "policy.logprob_batch_size=2",
        "grpo.max_num_steps=2",
        "grpo.val_at_start=false",
        "grpo.val_at_end=false",
        "checkpointing.enabled=false",
        "run.starvation_warning_s=20",
        "run.starvation_timeout_s=120",
        "policy.model_name=tiny://qwen2-vl-bpe",
        # The chat template's system turn + the image's 4-16 placeholders + the question.
        "policy.max_total_sequence_length=256",
        "data.max_input_seq_length=200",
        "policy.generation.allow_multimodal_inputs=true",
        "~data.train.params",
        "data.train.name=colours",
        f"+data.train.path={data}",
        "+data.train.env=hle",
        "+data.train.fields.images=images",
        "data.validation=null",
        "data.default_env=hle",
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_steps(run_dir) == [1, 2]
    assert len(assert_exactly_once(run_dir)) == 2 * 2
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fed = [e["metrics"]["train/images"] for e in steps if "train/images" in e["metrics"]]
    # One image per sample: 2 prompts x 2 samples a step, every step.
    assert fed == [4.0, 4.0]
