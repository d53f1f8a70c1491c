"""Tiny models built in code: deterministic, loadable by transformers, sized for vLLM-CPU."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from dockyard.cli import main
from dockyard.models import (
    TINY_RECIPES,
    TinyModelSpec,
    build_arithmetic_policy,
    build_character_tokenizer,
    load_policy,
    load_tokenizer,
    materialize_model_dir,
    train_bpe_tokenizer,
)


def test_the_arithmetic_policy_matches_the_quickstart_shape():
    model, tokenizer = build_arithmetic_policy()
    config = model.config
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (128, 4, 2)
    assert config.intermediate_size == 512 and config.tie_word_embeddings
    assert 450_000 < sum(p.numel() for p in model.parameters()) < 600_000
    assert len(tokenizer) == 15 == config.vocab_size
    ids = tokenizer("12+30=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+30="
    answer = tokenizer("42", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(answer) == "42<eos>"


def test_a_tiny_recipe_is_deterministic_and_resolved_by_name():
    model_a, _ = load_policy("tiny://qwen2-arithmetic", "float32")
    model_b, _ = build_arithmetic_policy(seed=0)
    other, _ = build_arithmetic_policy(seed=1)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(state_a[name], state_b[name]) for name in state_a)
    assert not torch.equal(state_a["lm_head.weight"], other.state_dict()["lm_head.weight"])
    bf16, _ = load_policy("tiny://qwen2-arithmetic", "bfloat16")
    assert next(bf16.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="known: tiny://qwen2-arithmetic"):
        load_policy("tiny://nope")
    with pytest.raises(ValueError, match="precision"):
        load_policy("tiny://qwen2-arithmetic", "float8")


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_arithmetic_policy(seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_the_bpe_tokenizer_round_trips_any_text():
    tokenizer = train_bpe_tokenizer(vocab_size=300)
    text = "naïve café — 日本語 ✓ 12+30=42"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert len(tokenizer) <= 300
    assert train_bpe_tokenizer(vocab_size=300).get_vocab() == tokenizer.get_vocab()
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(vocab_size=100)


def test_head_dim_must_suit_vllm_cpu_attention():
    with pytest.raises(ValueError, match="head_dim 48"):
        TinyModelSpec(hidden_size=192, num_attention_heads=4)
    assert TinyModelSpec(hidden_size=256, num_attention_heads=4).head_dim == 64


def test_character_tokenizer_rejects_ambiguous_vocabularies():
    with pytest.raises(ValueError):
        build_character_tokenizer(["1", "1"])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_init_tiny_writes_a_directory_transformers_loads(tmp_path, arch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("lorem ipsum dolor sit amet\n" * 20, encoding="utf-8")
    out = tmp_path / "model"
    assert (
        main(
            [
                "model",
                "init-tiny",
                "--out",
                str(out),
                "--arch",
                arch,
                "--corpus",
                str(corpus),
                "--vocab-size",
                "300",
            ]
        )
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.model_type == arch
    assert model.config.vocab_size == len(tokenizer) <= 300
    assert "lorem" in tokenizer.get_vocab() or "Ġipsum" in tokenizer.get_vocab()
    # AutoTokenizer (what vLLM uses) picks a model-specific class for a qwen2 directory; it
    # must encode exactly as the pipeline that was trained and saved.
    saved = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in ["lorem  ipsum\n  12+30=42", "naïve café — 日本語 ✓", "def f(x):\n\treturn x"]:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == saved.encode(text).ids
        assert tokenizer.decode(saved.encode(text).ids) == text
    ids = torch.tensor([tokenizer("lorem ipsum")["input_ids"]])
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))
    # A second run refuses to overwrite without --force.
    assert main(["model", "init-tiny", "--out", str(out)]) == 1
    assert "--force" in capsys.readouterr().err


def test_init_tiny_recipe_and_materialized_directories_load_identically(tmp_path):
    assert (
        main(["model", "init-tiny", "--out", str(tmp_path / "r"), "--recipe", "qwen2-arithmetic"])
        == 0
    )
    from_dir, tokenizer = load_policy(str(tmp_path / "r"))
    built, _ = load_policy("tiny://qwen2-arithmetic")
    for name, tensor in built.state_dict().items():
        assert torch.equal(from_dir.state_dict()[name], tensor), name
    in_memory = load_tokenizer("tiny://qwen2-arithmetic")
    for text in ["1+2=", "12+99=111", "+=0"]:
        assert tokenizer(text)["input_ids"] == in_memory(text)["input_ids"]
    assert len(tokenizer) == len(in_memory) == 15
    cached = materialize_model_dir("tiny://qwen2-arithmetic", tmp_path / "cache")
    assert materialize_model_dir("tiny://qwen2-arithmetic", tmp_path / "cache") == cached
    assert (cached / "model.safetensors").is_file() and (cached / "tokenizer.json").is_file()
    assert materialize_model_dir(str(tmp_path / "r"), tmp_path / "cache") == tmp_path / "r"
    with pytest.raises(FileNotFoundError):
        materialize_model_dir(str(tmp_path / "missing"), tmp_path / "cache")
    assert set(TINY_RECIPES) >= {"qwen2-arithmetic", "qwen2-bpe", "llama-bpe"}


def test_the_calculator_policy_spells_a_call_and_its_observation_in_few_tokens():
    from dockyard.models.tiny import build_tiny_recipe

    _, tok = build_tiny_recipe("qwen2-calculator")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'
    ids = tok.encode(call, add_special_tokens=False)
    assert len(ids) == 4 + len("37*48")  # four fixed pieces around the expression
    assert tok.decode(ids) == call
    observation = "<tool_response>\n1776\n</tool_response>\n"
    assert len(tok.encode(observation, add_special_tokens=False, split_special_tokens=True)) == 6


@pytest.mark.parametrize("name", ["qwen3-moe-arithmetic", "qwen3-moe-bpe"])
def test_the_moe_recipes_are_mixtures_of_four_experts_top_two(name):
    from dockyard.models.tiny import VLLM_CPU_HEAD_SIZES, build_tiny_recipe

    model, tokenizer = build_tiny_recipe(name)
    again, _ = build_tiny_recipe(name)
    assert model.config.model_type == "qwen3_moe"
    assert (model.config.num_experts, model.config.num_experts_per_tok) == (4, 2)
    assert model.config.head_dim in VLLM_CPU_HEAD_SIZES
    # Every layer's MLP is the mixture, its experts fused as expert parallelism splits them:
    # gate/up [experts, 2 × moe_intermediate_size, hidden], down [experts, hidden, intermediate].
    for layer in model.model.layers:
        assert tuple(layer.mlp.experts.gate_up_proj.shape) == (4, 2 * 64, 128)
        assert tuple(layer.mlp.experts.down_proj.shape) == (4, 128, 64)
    for (key, tensor), (_, other) in zip(
        model.state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert torch.equal(tensor, other), key  # the same weights in every process
    prompt = tokenizer("12+34=", return_tensors="pt").input_ids
    out = model.generate(prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert out.shape == (1, prompt.shape[1] + 3)  # Hugging Face generate runs it
