"""Refitting the torch engine: sources, validation, and requests in flight."""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest
from engine_reference import reference_logprobs
from safetensors.torch import save_file

from dockyard.engines.base import EngineError, GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.models import build_bpe_policy


def engine_for(model, tokenizer, **kwargs) -> TorchEngine:
    return TorchEngine(
        model,
        eos_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
        **kwargs,
    )


def uniform_state(model) -> dict:
    """Weights whose final norm is zero: every logit is 0, so each token's log-prob under
    temperature 1 is exactly -log(vocab) whatever the KV cache holds."""
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    state["model.norm.weight"].zero_()
    return state


@pytest.fixture(scope="module")
def other_policy():
    return build_bpe_policy("qwen2", seed=1)


async def test_refit_from_a_directory_or_file_changes_the_distribution(
    tiny_model, tiny_tokenizer, other_policy, tmp_path
):
    other_model = other_policy[0]
    other_model.save_pretrained(tmp_path / "dir")
    engine = engine_for(tiny_model, tiny_tokenizer)
    request = GenerationRequest(tiny_tokenizer("hello world")["input_ids"], "r")
    params = make_sampling_params(max_new_tokens=8, temperature=1.0, seed=0)

    await engine.update_weights(5, tmp_path / "dir")
    assert engine.current_version == 5
    (result,) = await engine.generate([request], params, 1)
    expected = reference_logprobs(
        other_model, list(request.prompt_token_ids), result.token_ids.tolist()
    )
    np.testing.assert_allclose(result.logprobs, expected, atol=2e-4)
    assert np.all(result.weight_versions == 5)

    # A single safetensors file, with the tied lm_head left out as HF saves it.
    state = {k: v for k, v in uniform_state(other_model).items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "weights.safetensors")
    await engine.update_weights(6, tmp_path / "weights.safetensors")
    (result,) = await engine.generate([request], params, 1)
    np.testing.assert_allclose(result.logprobs, -math.log(len(tiny_tokenizer)), atol=1e-5)
    assert np.all(result.weight_versions == 6)


async def test_a_bad_source_is_refused_and_the_model_is_left_intact(
    tiny_model, tiny_tokenizer, tmp_path
):
    engine = engine_for(tiny_model, tiny_tokenizer)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    good = uniform_state(tiny_model)

    wrong_shape = dict(good)
    wrong_shape["model.norm.weight"] = good["model.norm.weight"][:-1].clone()
    with pytest.raises(EngineError, match="shape"):
        await engine.update_weights(1, wrong_shape)
    unknown = {**good, "model.extra.weight": good["model.norm.weight"]}
    with pytest.raises(EngineError, match="unknown"):
        await engine.update_weights(1, unknown)
    missing = {k: v for k, v in good.items() if k != "model.norm.weight"}
    with pytest.raises(EngineError, match="lacks"):
        await engine.update_weights(1, missing)
    with pytest.raises(EngineError, match="does not exist"):
        await engine.update_weights(1, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match=r"no \.safetensors"):
        await engine.update_weights(1, tmp_path / "empty")

    assert engine.current_version == 0
    for name, tensor in tiny_model.state_dict().items():
        assert tensor.equal(before[name]), name


async def refit_during_generation(engine_kwargs, model, tokenizer, at_step: int):
    engine: TorchEngine
    tickets = []

    def refit_at(step: int) -> None:
        if step == at_step:
            tickets.append(engine.request_refit(1, uniform_state(model)))

    engine = engine_for(model, tokenizer, step_observer=refit_at, **engine_kwargs)
    params = make_sampling_params(max_new_tokens=12, temperature=1.0, ignore_eos=True, seed=0)
    request = GenerationRequest(tokenizer("hello world")["input_ids"], "r")
    results = await engine.generate([request, request], params, 1)
    return engine, tickets[0], results


async def test_continue_on_new_switches_weights_between_decode_steps(tiny_model, tiny_tokenizer):
    engine, ticket, results = await refit_during_generation(
        {"inflight_refit_policy": "continue_on_new"}, tiny_model, tiny_tokenizer, at_step=5
    )
    assert ticket.outcome == "applied"
    uniform = -math.log(len(tiny_tokenizer))
    for result in results:
        assert result.weight_versions.tolist() == [0] * 5 + [1] * 7
        # Tokens 6.. come from the new (uniform) weights; the first five did not.
        np.testing.assert_allclose(result.logprobs[5:], uniform, atol=1e-5)
        assert np.all(np.abs(result.logprobs[:5] - uniform) > 1e-3)
    assert engine.current_version == 1


async def test_finish_on_old_applies_the_refit_when_the_batch_ends(tiny_model, tiny_tokenizer):
    engine, ticket, results = await refit_during_generation(
        {"inflight_refit_policy": "finish_on_old"}, tiny_model, tiny_tokenizer, at_step=5
    )
    uniform = -math.log(len(tiny_tokenizer))
    for result in results:
        assert np.all(result.weight_versions == 0)
        assert np.all(np.abs(result.logprobs - uniform) > 1e-3)
    assert ticket.outcome == "applied"
    assert engine.current_version == 1
    params = make_sampling_params(max_new_tokens=4, temperature=1.0, seed=0)
    (after,) = await engine.generate([GenerationRequest([5, 6, 7])], params, 1)
    assert np.all(after.weight_versions == 1)
    np.testing.assert_allclose(after.logprobs, uniform, atol=1e-5)


async def test_update_weights_waits_for_a_busy_engine_and_a_newer_refit_supersedes(
    tiny_model, tiny_tokenizer
):
    """While a batch holds the model (paused inside the observer), two refits queue: the
    older one is superseded, the newer one is applied when the batch ends."""
    reached, proceed = threading.Event(), threading.Event()

    def pause_at_two(step: int) -> None:
        if step == 2:
            reached.set()
            proceed.wait(timeout=30)

    engine = engine_for(tiny_model, tiny_tokenizer, step_observer=pause_at_two)
    params = make_sampling_params(max_new_tokens=4, temperature=1.0, ignore_eos=True, seed=0)
    generation = asyncio.create_task(engine.generate([GenerationRequest([5, 6, 7])], params, 1))
    assert await asyncio.to_thread(reached.wait, 30)

    first = engine.request_refit(1, uniform_state(tiny_model))
    second = asyncio.create_task(engine.update_weights(2, uniform_state(tiny_model)))
    assert await asyncio.to_thread(first.done.wait, 30)
    assert first.outcome == "superseded"
    assert not second.done()
    assert engine.current_version == 0

    proceed.set()
    (result,) = await generation
    await second
    assert np.all(result.weight_versions == 0)
    assert engine.current_version == 2
    health = await engine.health()
    assert health.ok and health.weight_version == 2
