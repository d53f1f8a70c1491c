"""Bytes a weight event carries with LoRA (the adapter alone) against the whole model.

    python benchmarks/bench_lora_bytes.py

For the quickstart's policy (``tiny://qwen2-arithmetic``) the blob is built and serialised as the
trainer publishes it (``tensors_to_bytes`` of ``PolicyTrainer.engine_weights``, float32); for
Qwen2.5-0.5B and Llama-3.1-8B shapes (their published configs, built on the meta device: no
download, no memory) the bytes are counted from the tensors' shapes in bfloat16, the precision a
GPU run publishes. Adapter: rank 8 (the default) and 64 on q/k/v/o, and rank 16 on every linear
layer of the decoder.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dockyard.broker.weight_blobs.base import tensors_to_bytes
from dockyard.config.loader import load_config
from dockyard.config.sections.policy import LoRAConfig
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.models import load_policy
from dockyard.models.lora import adapter_for_engines, apply_lora

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EVERY_LINEAR = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
SHAPES = {
    "Qwen2.5-0.5B": lambda: Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
        )
    ),
    "Llama-3.1-8B": lambda: LlamaForCausalLM(
        LlamaConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
        )
    ),
}
ADAPTERS = {"r8 attention": (8, ATTENTION), "r64 attention": (64, ATTENTION)}
ADAPTERS["r16 every linear"] = (16, EVERY_LINEAR)


def row(model: str, adapter: str, full: int, adapter_bytes: int) -> str:
    return f"| {model} | {adapter} | {full:,} | {adapter_bytes:,} | {full / adapter_bytes:.0f}× |"


def quickstart() -> None:
    overrides = ["policy.dtensor_cfg.lora_cfg.enabled=true"]
    full_trainer = PolicyTrainer(
        load_policy("tiny://qwen2-arithmetic")[0], load_config("configs/quickstart.yaml")
    )
    lora_trainer = PolicyTrainer(
        load_policy("tiny://qwen2-arithmetic")[0], load_config("configs/quickstart.yaml", overrides)
    )
    full = len(tensors_to_bytes(full_trainer.engine_weights()))
    adapter = len(tensors_to_bytes(lora_trainer.engine_weights()))
    print(row("quickstart (tiny://qwen2-arithmetic, float32 blob)", "r8 attention", full, adapter))


def large() -> None:
    for name, build in SHAPES.items():
        for label, (rank, targets) in ADAPTERS.items():
            with torch.device("meta"):
                model = build()
                # parameters() counts tied embeddings once, as the blob stores them
                full = 2 * sum(p.numel() for p in model.parameters())
                apply_lora(model, LoRAConfig(enabled=True, rank=rank, target_modules=targets))
                adapter = 2 * sum(t.numel() for t in adapter_for_engines(model).values())
            print(row(f"{name} (bfloat16, from shapes)", label, full, adapter))


if __name__ == "__main__":
    print("| model | adapter | whole model (bytes) | adapter (bytes) | ratio |")
    print("|---|---|---|---|---|")
    quickstart()
    large()
