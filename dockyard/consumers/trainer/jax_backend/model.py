"""The Qwen2 / Llama decoder in Flax NNX, with the torch side's parameter names and layouts.

Every parameter sits at the attribute path of its Transformers name
(``model.layers.0.self_attn.q_proj.weight``), in the same ``[out, in]`` layout, so converting
weights is a rename of path separators and never a transpose (:mod:`.weights`). The forward pass
is Transformers' ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` (eager attention): RMSNorm in
float32, rotary embeddings with the default (unscaled) frequencies, grouped-query attention with
a causal and a key-padding mask, SiLU-gated MLP, optionally tied input/output embeddings.
Positions are ``0..L-1`` as Transformers uses for right-padded batches (``batch.py``).

What the family may vary and this module reads: sizes, ``rms_norm_eps``, ``rope_theta``,
``tie_word_embeddings``, and the biases (Qwen2: q/k/v; Llama: ``attention_bias`` /
``mlp_bias``). Anything else (rope scaling, sliding windows, another architecture) is refused in
:meth:`DecoderShape.from_hf_config` with the reason, never approximated.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


@dataclass(frozen=True)
class DecoderShape:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool

    @classmethod
    def from_hf_config(cls, config: object) -> DecoderShape:
        """The shape of a Transformers Qwen2 / Llama config; anything this module would not
        compute exactly as Transformers does is refused with its reason."""
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"the JAX trainer backend supports {', '.join(SUPPORTED_MODEL_TYPES)} models, "
                f"got model_type={model_type!r}"
            )
        rope = getattr(config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(
                f"the JAX trainer backend implements default rotary embeddings only, "
                f"got rope_type={rope_type!r}"
            )
        if model_type == "qwen2" and getattr(config, "use_sliding_window", False):
            raise ValueError("the JAX trainer backend has no sliding-window attention")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={config.hidden_act!r}: the JAX backend has SiLU only")  # type: ignore[attr-defined]  # an HF config: its fields are dynamic attributes
        heads = config.num_attention_heads  # type: ignore[attr-defined]  # an HF config's dynamic attribute
        hidden = config.hidden_size  # type: ignore[attr-defined]  # an HF config's dynamic attribute
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        is_qwen2 = model_type == "qwen2"
        return cls(
            vocab_size=config.vocab_size,  # type: ignore[attr-defined]  # an HF config's dynamic attribute
            hidden_size=hidden,
            num_layers=config.num_hidden_layers,  # type: ignore[attr-defined]  # an HF config's dynamic attribute
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,  # type: ignore[attr-defined]  # an HF config's dynamic attribute
            rms_norm_eps=float(config.rms_norm_eps),  # type: ignore[attr-defined]  # an HF config's dynamic attribute
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(getattr(config, "attention_bias", False)),
            o_bias=(not is_qwen2) and bool(getattr(config, "attention_bias", False)),
            mlp_bias=(not is_qwen2) and bool(getattr(config, "mlp_bias", False)),
        )


class Linear(nnx.Module):
    """``x @ weight.T + bias`` with the torch layout ``weight: [out, in]``."""

    def __init__(self, n_in: int, n_out: int, bias: bool, *, rngs: nnx.Rngs) -> None:
        # Initial values never matter: the weights always come from a checkpoint (.weights).
        self.weight = nnx.Param(jax.random.normal(rngs.params(), (n_out, n_in)) * 0.02)
        self.bias = nnx.Param(jnp.zeros((n_out,))) if bias else None

    def __call__(self, x: Array) -> Array:
        y = x @ self.weight[...].astype(x.dtype).T
        if self.bias is not None:
            y = y + self.bias[...].astype(x.dtype)
        return y


class RMSNorm(nnx.Module):
    def __init__(self, size: int, eps: float) -> None:
        self.weight = nnx.Param(jnp.ones((size,)))
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        # As Transformers: normalise in float32, scale in the activation dtype.
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * normed.astype(x.dtype)


def _rotate_half(x: Array) -> Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotary(length: int, head_dim: int, theta: float) -> tuple[Array, Array]:
    """``cos, sin`` of shape ``[L, head_dim]`` for positions ``0..L-1``."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


class Attention(nnx.Module):
    def __init__(self, shape: DecoderShape, *, rngs: nnx.Rngs) -> None:
        h, d = shape.hidden_size, shape.head_dim
        self.q_proj = Linear(h, shape.num_heads * d, shape.qkv_bias, rngs=rngs)
        self.k_proj = Linear(h, shape.num_kv_heads * d, shape.qkv_bias, rngs=rngs)
        self.v_proj = Linear(h, shape.num_kv_heads * d, shape.qkv_bias, rngs=rngs)
        self.o_proj = Linear(shape.num_heads * d, h, shape.o_bias, rngs=rngs)
        self.shape = shape

    def __call__(self, x: Array, cos: Array, sin: Array, key_mask: Array) -> Array:
        s = self.shape
        b, length, _ = x.shape
        q = self.q_proj(x).reshape(b, length, s.num_heads, s.head_dim)
        k = self.k_proj(x).reshape(b, length, s.num_kv_heads, s.head_dim)
        v = self.v_proj(x).reshape(b, length, s.num_kv_heads, s.head_dim)
        cos, sin = cos[None, :, None, :].astype(x.dtype), sin[None, :, None, :].astype(x.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        groups = s.num_heads // s.num_kv_heads
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(s.head_dim)
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        allowed = causal[None, None] & key_mask[:, None, None, :].astype(bool)
        lowest = jnp.finfo(jnp.float32).min  # type: ignore[no-untyped-call]  # unannotated in jax
        scores = jnp.where(allowed, scores, lowest)
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, length, -1)
        return self.o_proj(out)


class MLP(nnx.Module):
    def __init__(self, shape: DecoderShape, *, rngs: nnx.Rngs) -> None:
        h, i, bias = shape.hidden_size, shape.intermediate_size, shape.mlp_bias
        self.gate_proj = Linear(h, i, bias, rngs=rngs)
        self.up_proj = Linear(h, i, bias, rngs=rngs)
        self.down_proj = Linear(i, h, bias, rngs=rngs)

    def __call__(self, x: Array) -> Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, shape: DecoderShape, *, rngs: nnx.Rngs) -> None:
        self.self_attn = Attention(shape, rngs=rngs)
        self.mlp = MLP(shape, rngs=rngs)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def __call__(self, x: Array, cos: Array, sin: Array, key_mask: Array) -> Array:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, key_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Embedding(nnx.Module):
    def __init__(self, vocab: int, hidden: int, *, rngs: nnx.Rngs) -> None:
        self.weight = nnx.Param(jax.random.normal(rngs.params(), (vocab, hidden)) * 0.02)


class Decoder(nnx.Module):
    """Transformers' ``Qwen2Model`` / ``LlamaModel`` (the ``model.`` prefix of the names)."""

    def __init__(self, shape: DecoderShape, *, rngs: nnx.Rngs) -> None:
        self.embed_tokens = Embedding(shape.vocab_size, shape.hidden_size, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(shape, rngs=rngs) for _ in range(shape.num_layers)])
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.shape = shape

    def __call__(self, input_ids: Array, attention_mask: Array, dtype: jnp.dtype) -> Array:
        x = self.embed_tokens.weight[...][input_ids].astype(dtype)
        cos, sin = rotary(input_ids.shape[1], self.shape.head_dim, self.shape.rope_theta)
        for layer in self.layers:
            x = layer(x, cos, sin, attention_mask)
        return self.norm(x)


class CausalLM(nnx.Module):
    """Transformers' ``*ForCausalLM``: ``logits = lm_head(model(ids))`` (the embedding when
    tied: one parameter, so its gradient sums both uses as torch's shared tensor does)."""

    def __init__(self, shape: DecoderShape, *, rngs: nnx.Rngs) -> None:
        self.model = Decoder(shape, rngs=rngs)
        self.lm_head = (
            None
            if shape.tie_word_embeddings
            else Linear(shape.hidden_size, shape.vocab_size, False, rngs=rngs)
        )
        self.shape = shape

    def __call__(
        self, input_ids: Array, attention_mask: Array, dtype: jnp.dtype = jnp.float32
    ) -> Array:
        """``[B, L, V]`` float32 logits; ``dtype`` is the compute precision of the layers."""
        hidden = self.model(input_ids, attention_mask, dtype)
        if self.lm_head is None:
            head = self.model.embed_tokens.weight[...].astype(dtype)
            return (hidden @ head.T).astype(jnp.float32)
        return self.lm_head(hidden).astype(jnp.float32)


def next_token_logprobs(logits: Array, input_ids: Array, temperature: float = 1.0) -> Array:
    """``[B, L-1]``: ``log p(input_ids[:, t+1] | …)`` under ``logits / temperature``, as
    :func:`dockyard.consumers.trainer.micro_batches.next_token_logprobs` computes it."""
    logits = logits[:, :-1].astype(jnp.float32)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:]
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)
