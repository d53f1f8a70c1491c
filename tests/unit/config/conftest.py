"""Fixtures for config tests: a minimal valid config written to a temporary directory."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

MINIMAL: dict[str, object] = {
    "policy": {
        "model_name": "tiny://qwen2-arithmetic",
        "train_global_batch_size": 16,
        "train_micro_batch_size": 4,
        "max_total_sequence_length": 64,
        "generation": {"max_new_tokens": 16},
    },
    "loss_fn": {},
    "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4},
    "env": {},
    "data": {"train": {"name": "arithmetic"}},
    "cluster": {},
    "logger": {},
    "checkpointing": {},
}


@pytest.fixture
def minimal_config() -> dict[str, object]:
    """A fresh deep copy of the minimal valid config, to modify in a test."""
    return copy.deepcopy(MINIMAL)


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[..., Path]:
    """Write a YAML file (default: the minimal valid config) and return its path."""

    def write(content: object = None, name: str = "config.yaml") -> Path:
        path = tmp_path / name
        text = (
            content
            if isinstance(content, str)
            else yaml.safe_dump(MINIMAL if content is None else content, sort_keys=False)
        )
        path.write_text(text)
        return path

    return write
