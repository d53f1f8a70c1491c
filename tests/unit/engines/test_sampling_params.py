"""Sampling parameters are validated before any engine sees them."""

from __future__ import annotations

import math

import pytest
import torch

from dockyard.config.sections.policy import GenerationConfig
from dockyard.engines.base import InvalidSamplingParams
from dockyard.engines.sampling import (
    make_sampling_params,
    processed_logprobs,
    sampling_params_from_config,
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": math.nan}, "temperature: must be a finite number"),
        ({"temperature": math.inf}, "temperature: must be a finite number"),
        ({"temperature": -0.5}, "temperature: must be >= 0"),
        ({"top_p": math.nan}, "top_p: must be a finite number"),
        ({"top_p": 0.0}, "top_p: must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p: must be in (0, 1]"),
        ({"top_k": 0}, "top_k: must be >= 1"),
        ({"max_new_tokens": 0}, "max_new_tokens: must be >= 1"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_strings": [""]}, "empty stop string"),
    ],
)
def test_invalid_values_are_refused_with_their_key(kwargs, message):
    with pytest.raises(InvalidSamplingParams) as caught:
        make_sampling_params(**{"max_new_tokens": 8, **kwargs})
    assert message in str(caught.value)


def test_every_problem_is_reported_at_once_with_the_config_path():
    # model_construct skips validation, as a worker handed an unvalidated config would.
    config = GenerationConfig.model_construct(
        **{**GenerationConfig().model_dump(), "temperature": math.nan, "top_p": math.inf}
    )
    with pytest.raises(InvalidSamplingParams) as caught:
        sampling_params_from_config(config)
    text = str(caught.value)
    assert "policy.generation.temperature" in text
    assert "policy.generation.top_p" in text


def test_a_valid_config_maps_onto_sampling_params():
    config = GenerationConfig(
        max_new_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=-1,
        stop_token_ids=[3, 4],
        stop_strings=["\n\n"],
        ignore_eos=True,
        seed=11,
    )
    params = sampling_params_from_config(config)
    assert params.max_new_tokens == 7
    assert (params.temperature, params.top_p, params.top_k) == (0.5, 0.9, None)
    assert params.stop_token_ids == (3, 4)
    assert params.stop_strings == ("\n\n",)
    assert params.ignore_eos and params.seed == 11


def test_processed_distribution_keeps_the_smallest_top_p_set():
    # Probabilities 0.5, 0.3, 0.15, 0.05: top_p=0.75 keeps the first two (0.5 < 0.75 ≤ 0.8).
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    params = make_sampling_params(max_new_tokens=1, top_p=0.75)
    probs = processed_logprobs(logits, params).exp()[0]
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # The most likely token survives even a tiny top_p.
    tiny = processed_logprobs(logits, make_sampling_params(max_new_tokens=1, top_p=0.01))
    torch.testing.assert_close(tiny.exp()[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # top-k then top-p: k=3 renormalises to 0.526/0.316/0.158, then p=0.6 keeps two.
    both = processed_logprobs(logits, make_sampling_params(max_new_tokens=1, top_k=3, top_p=0.6))
    torch.testing.assert_close(both.exp()[0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
