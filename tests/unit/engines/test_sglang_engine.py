"""The SGLang engine's HTTP client, against a stand-in server (SGLang cannot run here)."""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest
from engine_reference import reference_logprobs
from PIL import Image
from standin_servers import StandInSglangServer

from dockyard.engines.base import EngineError, GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.sglang_engine import SglangEngine
from dockyard.models import build_bpe_policy


@pytest.fixture
def standin(served_engine):
    with StandInSglangServer(served_engine) as server:
        yield server


@pytest.fixture
async def sglang(standin, tmp_path):
    engine = SglangEngine([standin.url], request_timeout_s=30, staging_dir=tmp_path / "stage")
    yield engine
    await engine.shutdown()


def requests_for(tokenizer) -> list[GenerationRequest]:
    return [
        GenerationRequest(tokenizer(t)["input_ids"], f"q{i}")
        for i, t in enumerate(["hello world", "The quick brown fox"])
    ]


async def test_generation_returns_tokens_logprobs_and_versions(
    sglang, standin, tiny_model, tiny_tokenizer
):
    requests = requests_for(tiny_tokenizer)
    params = make_sampling_params(max_new_tokens=6, temperature=0.8, top_k=30, seed=4)
    results = await sglang.generate(requests, params, num_samples=3)

    assert [(r.request_index, r.sample_index) for r in results] == [
        (i, s) for i in range(2) for s in range(3)
    ]
    for result in results:
        prompt = list(requests[result.request_index].prompt_token_ids)
        expected = reference_logprobs(
            tiny_model, prompt, result.token_ids.tolist(), temperature=0.8, top_k=30
        )
        np.testing.assert_allclose(result.logprobs, expected, atol=2e-4)
        assert result.weight_versions.tolist() == [0] * result.num_tokens
        assert result.finish_reason in ("stop", "length")
    generate_bodies = [body for path, body in standin.received if path == "/generate"]
    assert len(generate_bodies) == 2
    # The two requests go out concurrently: match each body to its request by content.
    assert sorted(body["input_ids"] for body in generate_bodies) == sorted(
        [list(request.prompt_token_ids)] * 3 for request in requests
    )
    for body in generate_bodies:
        assert body["return_logprob"] is True and body["logprob_start_len"] == -1
        assert body["sampling_params"]["top_k"] == 30
        assert body["sampling_params"]["sampling_seed"] == 4


async def test_refit_from_disk_switches_the_server_weights(
    sglang, standin, tiny_tokenizer, tmp_path
):
    other, _ = build_bpe_policy("qwen2", seed=2)
    other.save_pretrained(tmp_path / "v3")
    await sglang.update_weights(3, tmp_path / "v3")
    assert sglang.current_version == 3
    (body,) = [b for p, b in standin.received if p == "/update_weights_from_disk"]
    assert body == {"model_path": str(tmp_path / "v3"), "weight_version": "3", "flush_cache": True}

    request = requests_for(tiny_tokenizer)[:1]
    params = make_sampling_params(max_new_tokens=5, temperature=1.0, seed=0)
    (result,) = await sglang.generate(request, params, 1)
    expected = reference_logprobs(
        other, list(request[0].prompt_token_ids), result.token_ids.tolist()
    )
    np.testing.assert_allclose(result.logprobs, expected, atol=2e-4)
    assert result.weight_versions.tolist() == [3] * result.num_tokens

    # A state dict is staged as safetensors on disk for the server to read.
    state = {k: v.clone() for k, v in other.state_dict().items()}
    state["model.norm.weight"].zero_()
    await sglang.update_weights(4, state)
    (result,) = await sglang.generate(request, params, 1)
    np.testing.assert_allclose(result.logprobs, -math.log(len(tiny_tokenizer)), atol=1e-5)
    assert result.weight_versions.tolist() == [4] * result.num_tokens


async def test_a_refused_refit_raises_and_keeps_the_version(sglang, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    import torch
    from safetensors.torch import save_file

    save_file({"not.a.weight": torch.zeros(2)}, bad / "model.safetensors")
    with pytest.raises(EngineError, match="refused the refit"):
        await sglang.update_weights(9, bad)
    assert sglang.current_version == 0


async def test_images_are_refused_before_anything_is_sent(sglang, standin):
    request = GenerationRequest([5, 6, 7], "img", images=[Image.new("RGB", (4, 4))])
    with pytest.raises(EngineError, match="does not forward images"):
        await sglang.generate([request], make_sampling_params(max_new_tokens=2), 1)
    assert standin.paths() == []


async def test_health_and_server_errors(sglang, standin):
    health = await sglang.health()
    assert health.ok and health.backend == "sglang"
    dead = SglangEngine(["http://127.0.0.1:9"], request_timeout_s=2)
    assert not (await dead.health()).ok
    with pytest.raises(EngineError, match=r"127\.0\.0\.1:9"):
        await dead.generate([GenerationRequest([5])], make_sampling_params(max_new_tokens=1), 1)
    await dead.shutdown()
    await sglang.shutdown()
    with pytest.raises(EngineError, match="shut down"):
        await sglang.generate([GenerationRequest([5])], make_sampling_params(max_new_tokens=1), 1)


async def test_a_refit_failing_on_one_server_holds_requests_until_every_server_is_done(
    served_engine, tmp_path
):
    release_slow = threading.Event()

    def refuse(query: dict, body: dict) -> tuple[int, object]:
        return 200, {"success": False, "message": "no room"}

    def slow(query: dict, body: dict) -> tuple[int, object]:
        release_slow.wait(timeout=60)
        return 200, {"success": True, "message": "ok"}

    with StandInSglangServer(served_engine) as failing, StandInSglangServer(served_engine) as busy:
        failing.routes[("POST", "/update_weights_from_disk")] = refuse
        busy.routes[("POST", "/update_weights_from_disk")] = slow
        engine = SglangEngine([failing.url, busy.url], staging_dir=tmp_path / "stage")
        weights = tmp_path / "v5"
        served_engine.model.save_pretrained(weights)
        try:
            refit = asyncio.ensure_future(engine.update_weights(5, weights))
            # The failure comes back at once; the refit must still wait for the busy server
            # (a request sent now would reach it mid-load with the old version's stamp).
            done, _ = await asyncio.wait({refit}, timeout=0.5)
            assert not done
            release_slow.set()
            with pytest.raises(EngineError, match=r"failed on 1 of 2 sglang servers: .*no room"):
                await refit
            assert engine.current_version == 0
        finally:
            release_slow.set()
            await engine.shutdown()
