"""The torch engine against an independent computation on the same tiny model."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch
from engine_reference import reference_logprobs

from dockyard.engines.base import EngineError, GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine


def make_engine(model, tokenizer, **kwargs) -> TorchEngine:
    return TorchEngine(
        model,
        eos_token_ids=kwargs.pop("eos_token_ids", [tokenizer.eos_token_id]),
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
        **kwargs,
    )


def prompts(tokenizer) -> list[GenerationRequest]:
    # Different lengths, so the batch is left-padded.
    texts = ["hello world", "The quick brown fox jumps over", "42"]
    return [
        GenerationRequest(tokenizer(text)["input_ids"], request_id=f"r{i}")
        for i, text in enumerate(texts)
    ]


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, None, 1.0), (0.7, None, 1.0), (1.3, 20, 1.0), (0.8, None, 0.85), (0.6, 40, 0.7)],
)
async def test_logprobs_match_a_fresh_forward_of_the_processed_distribution(
    tiny_model, tiny_tokenizer, temperature, top_k, top_p
):
    engine = make_engine(tiny_model, tiny_tokenizer)
    requests = prompts(tiny_tokenizer)
    params = make_sampling_params(
        max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p, seed=3
    )
    results = await engine.generate(requests, params, num_samples=2)

    assert [(r.request_index, r.sample_index) for r in results] == [
        (i, s) for i in range(3) for s in range(2)
    ]
    for result in results:
        prompt = list(requests[result.request_index].prompt_token_ids)
        expected = reference_logprobs(
            tiny_model,
            prompt,
            result.token_ids.tolist(),
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
        )
        assert result.token_ids.dtype == np.int64
        assert result.logprobs.dtype == np.float32
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-4)
        assert np.all(result.weight_versions == 0)
        assert result.request_id == f"r{result.request_index}"


async def test_truncated_distributions_only_sample_kept_tokens(tiny_model, tiny_tokenizer):
    """top-k=3 keeps three tokens: each sampled token is among the 3 most likely ones."""
    engine = make_engine(tiny_model, tiny_tokenizer)
    request = prompts(tiny_tokenizer)[:1]
    params = make_sampling_params(max_new_tokens=8, temperature=1.0, top_k=3, seed=0)
    (result,) = await engine.generate(request, params, num_samples=1)
    prompt = list(request[0].prompt_token_ids)
    ids = torch.tensor([prompt + result.token_ids.tolist()])
    with torch.no_grad():
        logits = tiny_model(ids).logits[0, len(prompt) - 1 : -1]
    top3 = torch.topk(logits, 3, dim=-1).indices
    for position, token in enumerate(result.token_ids):
        assert token in top3[position].tolist()
    # Three renormalised options: each log-prob is at least log of the smallest share > 0.
    assert np.all(result.logprobs <= 0.0)
    assert np.all(result.logprobs > math.log(1e-3))


async def test_greedy_follows_the_argmax_with_point_mass_logprobs(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer)
    request = prompts(tiny_tokenizer)[1:2]
    params = make_sampling_params(max_new_tokens=10, temperature=0.0, ignore_eos=True)
    (result,) = await engine.generate(request, params, num_samples=1)
    ids = list(request[0].prompt_token_ids)
    for token in result.token_ids:
        with torch.no_grad():
            expected = int(tiny_model(torch.tensor([ids])).logits[0, -1].argmax())
        assert token == expected
        ids.append(int(token))
    assert np.all(result.logprobs == 0.0)


async def test_a_seed_reproduces_a_call_and_another_seed_does_not(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer)
    requests = prompts(tiny_tokenizer)

    async def run(seed: int):
        params = make_sampling_params(max_new_tokens=16, temperature=1.0, seed=seed)
        return await engine.generate(requests, params, num_samples=2)

    first, again, other = await run(7), await run(7), await run(8)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert any(
        not np.array_equal(a.token_ids, c.token_ids) for a, c in zip(first, other, strict=True)
    )
    # The G samples of one prompt are independent draws, not copies.
    assert not np.array_equal(first[0].token_ids, first[1].token_ids)


async def greedy_tokens(engine: TorchEngine, request: GenerationRequest, n: int) -> list[int]:
    params = make_sampling_params(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    (result,) = await engine.generate([request], params, num_samples=1)
    return result.token_ids.tolist()


async def test_stop_token_ids_end_a_sample_including_the_stop_token(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer)
    request = prompts(tiny_tokenizer)[0]
    tokens = await greedy_tokens(engine, request, 12)
    stop = tokens[3]
    params = make_sampling_params(max_new_tokens=12, temperature=0.0, stop_token_ids=[stop])
    (result,) = await engine.generate([request], params, num_samples=1)
    cut = tokens.index(stop) + 1
    assert result.token_ids.tolist() == tokens[:cut]
    assert result.finish_reason == "stop"


async def test_eos_stops_unless_ignore_eos(tiny_model, tiny_tokenizer):
    """The random model rarely samples the real EOS, so declare one it does produce."""
    request = prompts(tiny_tokenizer)[2]
    probe = make_engine(tiny_model, tiny_tokenizer)
    tokens = await greedy_tokens(probe, request, 10)
    eos = tokens[2]
    engine = make_engine(tiny_model, tiny_tokenizer, eos_token_ids=[eos])

    stopped = await engine.generate(
        [request], make_sampling_params(max_new_tokens=10, temperature=0.0), 1
    )
    assert stopped[0].token_ids.tolist() == tokens[: tokens.index(eos) + 1]
    assert stopped[0].finish_reason == "stop"

    ignoring = await engine.generate(
        [request], make_sampling_params(max_new_tokens=10, temperature=0.0, ignore_eos=True), 1
    )
    assert ignoring[0].token_ids.tolist() == tokens
    assert ignoring[0].finish_reason == "length"


async def test_stop_strings_end_a_sample_at_the_token_that_completes_them(
    tiny_model, tiny_tokenizer
):
    engine = make_engine(tiny_model, tiny_tokenizer)
    request = prompts(tiny_tokenizer)[1]
    tokens = await greedy_tokens(engine, request, 12)
    text = tiny_tokenizer.decode(tokens)
    stop = next(
        tiny_tokenizer.decode(tokens[i : i + 1]).strip()
        for i in range(2, 12)
        if tiny_tokenizer.decode(tokens[i : i + 1]).strip()
    )
    assert stop in text
    expected_len = next(
        n for n in range(1, len(tokens) + 1) if stop in tiny_tokenizer.decode(tokens[:n])
    )
    params = make_sampling_params(max_new_tokens=12, temperature=0.0, stop_strings=[stop])
    (result,) = await engine.generate([request], params, num_samples=1)
    assert result.token_ids.tolist() == tokens[:expected_len]
    assert result.finish_reason == "stop"


async def test_the_context_window_bounds_generation(tiny_model, tiny_tokenizer):
    request = prompts(tiny_tokenizer)[0]
    prompt_len = len(request.prompt_token_ids)
    engine = make_engine(tiny_model, tiny_tokenizer, max_model_len=prompt_len + 3)
    params = make_sampling_params(max_new_tokens=10, temperature=1.0, ignore_eos=True, seed=0)
    (result,) = await engine.generate([request], params, 1)
    assert result.num_tokens == 3
    assert result.finish_reason == "length"

    cramped = make_engine(tiny_model, tiny_tokenizer, max_model_len=prompt_len)
    with pytest.raises(EngineError, match="no room"):
        await cramped.generate([request], params, 1)


async def test_bad_requests_are_refused_before_compute(tiny_model, tiny_tokenizer):
    engine = make_engine(tiny_model, tiny_tokenizer)
    params = make_sampling_params(max_new_tokens=4)
    with pytest.raises(ValueError, match="empty prompt"):
        await engine.generate([GenerationRequest([], "empty")], params, 1)
    with pytest.raises(ValueError, match="num_samples"):
        await engine.generate(prompts(tiny_tokenizer), params, 0)
    no_tokenizer = TorchEngine(tiny_model, eos_token_ids=[2], pad_token_id=0)
    with pytest.raises(EngineError, match="tokenizer"):
        await no_tokenizer.generate(
            prompts(tiny_tokenizer), make_sampling_params(max_new_tokens=4, stop_strings=["x"]), 1
        )


async def test_shutdown_aborts_generation_in_flight(tiny_model, tiny_tokenizer):
    engine: TorchEngine

    def abort_at_step_three(step: int) -> None:
        if step == 3:
            asyncio.run(engine.shutdown())

    engine = make_engine(tiny_model, tiny_tokenizer, step_observer=abort_at_step_three)
    params = make_sampling_params(max_new_tokens=20, temperature=1.0, ignore_eos=True, seed=0)
    results = await engine.generate(prompts(tiny_tokenizer), params, 1)
    assert [r.finish_reason for r in results] == ["abort"] * 3
    assert [r.num_tokens for r in results] == [3] * 3
    health = await engine.health()
    assert not health.ok
    with pytest.raises(EngineError, match="shut down"):
        await engine.generate(prompts(tiny_tokenizer), params, 1)


async def test_batches_bounded_by_max_batch_size_give_the_same_logprobs(tiny_model, tiny_tokenizer):
    requests = prompts(tiny_tokenizer)
    params = make_sampling_params(max_new_tokens=6, temperature=0.9, seed=1)
    engine = make_engine(tiny_model, tiny_tokenizer, max_batch_size=2)
    results = await engine.generate(requests, params, 2)
    assert len(results) == 6
    for result in results:
        prompt = list(requests[result.request_index].prompt_token_ids)
        expected = reference_logprobs(
            tiny_model, prompt, result.token_ids.tolist(), temperature=0.9
        )
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-4)
