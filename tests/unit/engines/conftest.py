"""Fixtures for engine tests: a tiny BPE Qwen2 built in code (no download)."""

from __future__ import annotations

import pytest

from dockyard.models import build_bpe_policy


@pytest.fixture(scope="session")
def tiny_policy():
    return build_bpe_policy("qwen2", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_policy):
    return tiny_policy[1]


@pytest.fixture
def tiny_model(tiny_policy):
    """A private copy per test: refit tests overwrite its weights."""
    import copy

    return copy.deepcopy(tiny_policy[0])


@pytest.fixture
def served_engine(tiny_model, tiny_tokenizer):
    """The torch engine that the stand-in inference servers generate with."""
    from dockyard.engines.torch_engine import TorchEngine

    return TorchEngine(
        tiny_model,
        eos_token_ids=[tiny_tokenizer.eos_token_id],
        pad_token_id=tiny_tokenizer.pad_token_id,
        tokenizer=tiny_tokenizer,
    )
