"""The Flax NNX decoder computes what Transformers computes, from the same weights by name.

Each architecture the torch side trains (tiny Qwen2 with q/k/v biases and tied embeddings,
tiny Llama without biases and untied, grouped-query attention) is built by
``dockyard.models.tiny``; its ``state_dict`` goes into the JAX model by name and the logits of a
right-padded batch must match Transformers' own forward at every unpadded position.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from dockyard.consumers.trainer.jax_backend.model import CausalLM, DecoderShape
from dockyard.consumers.trainer.jax_backend.weights import (
    host_arrays,
    load_named,
    load_safetensors,
    save_safetensors,
)
from dockyard.models.tiny import TinyModelSpec, build_tiny_model
from dockyard.models.tokenizers import build_character_tokenizer

SPECS = {
    "qwen2_tied": TinyModelSpec(arch="qwen2", seed=3),
    "llama_untied_gqa": TinyModelSpec(
        arch="llama", num_key_value_heads=2, tie_word_embeddings=False, seed=4
    ),
}


def _torch_model(name):
    return build_tiny_model(SPECS[name], build_character_tokenizer())


def _jax_model(torch_model):
    shape = DecoderShape.from_hf_config(torch_model.config)
    graph, template = nnx.split(CausalLM(shape, rngs=nnx.Rngs(0)))
    arrays = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    state = load_named(template, arrays, tied=shape.tie_word_embeddings, where="test")
    return nnx.merge(graph, state), shape


def _batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 15, (3, 11), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # right padding, as batch.py builds it
    mask[2, 4:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


@pytest.mark.parametrize("name", sorted(SPECS))
def test_logits_match_transformers(name):
    torch_model = _torch_model(name)
    model, _ = _jax_model(torch_model)
    ids, mask = _batch()
    with torch.no_grad():
        expected = torch_model(input_ids=ids, attention_mask=mask).logits.numpy()
    actual = np.asarray(model(jnp.asarray(ids.numpy()), jnp.asarray(mask.numpy())))
    valid = mask.numpy().astype(bool)
    np.testing.assert_allclose(actual[valid], expected[valid], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_weights_round_trip_by_name_through_safetensors(name, tmp_path):
    torch_model = _torch_model(name)
    model, shape = _jax_model(torch_model)
    out = host_arrays(nnx.state(model, nnx.Param), tied=shape.tie_word_embeddings)
    expected = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    assert sorted(out) == sorted(expected)  # every torch name, tied head included
    for key, value in expected.items():
        assert out[key].dtype == value.dtype and np.array_equal(out[key], value), key
    path = save_safetensors(out, tmp_path / "model.safetensors")
    back = load_safetensors(path)
    reloaded = type(torch_model)(torch_model.config)
    reloaded.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(value, torch_model.state_dict()[key]), key


def test_mismatched_weights_are_refused_with_their_names():
    torch_model = _torch_model("qwen2_tied")
    shape = DecoderShape.from_hf_config(torch_model.config)
    _, template = nnx.split(CausalLM(shape, rngs=nnx.Rngs(0)))
    arrays = {k: v.numpy() for k, v in torch_model.state_dict().items()}
    missing = dict(arrays)
    del missing["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_named(template, missing, tied=True, where="ckpt")
    untied = dict(arrays, **{"lm_head.weight": arrays["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match=r"differs from model\.embed_tokens\.weight"):
        load_named(template, untied, tied=True, where="ckpt")
    wrong = dict(arrays, **{"model.norm.weight": np.ones(7, np.float32)})
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(7,\)"):
        load_named(template, wrong, tied=True, where="ckpt")


def test_unsupported_architectures_are_refused():
    config = _torch_model("qwen2_tied").config
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        DecoderShape.from_hf_config(config)
