"""GPU check, measurement 4: sparse weight patches of the Qwen2.5-1.5B-shaped model, on the GPU.

The trajectory is bench_weight_patches.py's (its ``grpo_like_step``, ``published`` and
``bit_equal``): float32 master weights and AdamW at lr 1e-6 on the GPU, weights published in
bf16 *as the GPU holds them*; each step's bf16 weights are encoded as a patch on the previous
step's (``encode_patch``: the state digest, the diff, the coding), applied back
(``apply_patch``) and checked bit for bit. The baseline in the same run is the full snapshot
(``tensors_to_bytes``, the safetensors blob published without patches). GB/s are bf16 bytes of
the whole model per second. The patch code runs in numpy on the host: on a GPU its cost
includes the device-to-host copy of every tensor, which is what a trainer on a GPU pays.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from bench_weight_patches import bit_equal, published
from gpu_check_common import build_qwen2, device_name, free, sizes, synchronize, write_row

from dockyard.broker.weight_blobs.base import tensors_to_bytes
from dockyard.broker.weight_blobs.patch import (
    ChainLink,
    PatchHeader,
    apply_patch,
    encode_patch,
    state_digest,
)

MODEL = "qwen2.5-1.5b"
LR = 1e-6


def policy_gradient_step(
    model: torch.nn.Module,
    vocab: int,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    dev: torch.device,
) -> None:
    """bench_weight_patches' ``grpo_like_step`` (−A·log π on random tokens, A = ±1 per
    sequence) with its inputs on ``dev`` and the forward in bf16 autocast, as the trainer runs
    it on a GPU; the tokens are drawn on the CPU generator, so both ends draw the same ones."""
    tokens = torch.randint(0, vocab, (4, 64), generator=generator)
    advantages = torch.randint(0, 2, (4, 1), generator=generator).float() * 2 - 1
    tokens, advantages = tokens.to(dev), advantages.to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = model(input_ids=tokens).logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    loss = -(advantages * logprobs).mean()
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()


def run(results: Path, dev: torch.device, dry_run: bool) -> None:
    size = sizes(dry_run)
    model = build_qwen2(MODEL, size.shapes, dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    generator = torch.Generator().manual_seed(0)
    base = published(model)
    base_digest = state_digest(base)
    for step in range(1, size.patch_steps + 1):
        policy_gradient_step(model, size.shapes[MODEL]["vocab_size"], optimizer, generator, dev)
        new = published(model)
        synchronize(dev)
        started = time.perf_counter()
        digest = state_digest(new)
        header = PatchHeader(
            step, step - 1, base_digest, digest, ChainLink(0, "sha256:" + "0" * 64, 0)
        )
        blob, stats = encode_patch(base, new, header)
        encode_s = time.perf_counter() - started
        started = time.perf_counter()
        snapshot = tensors_to_bytes(new)
        snapshot_s = time.perf_counter() - started
        started = time.perf_counter()
        rebuilt = apply_patch(base, blob, base_version=step - 1, base_digest=base_digest)
        synchronize(dev)
        apply_s = time.perf_counter() - started
        full = len(snapshot)
        write_row(
            results,
            "weight_patch",
            model=MODEL,
            device=device_name(dev),
            lr=LR,
            step=step,
            changed=stats.changed_fraction,
            patch_bytes=len(blob),
            full_bytes=full,
            encode_s=encode_s,
            apply_s=apply_s,
            snapshot_s=snapshot_s,
            encode_gb_s=full / encode_s / 1e9,
            apply_gb_s=full / apply_s / 1e9,
            snapshot_gb_s=full / snapshot_s / 1e9,
            identical=bit_equal(_on_cpu(rebuilt), _on_cpu(new)),
        )
        del snapshot, rebuilt
        base, base_digest = new, digest
    del model, optimizer, base
    free(dev)


def _on_cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``bit_equal`` views the bits as int16 on whatever device: compare on one side."""
    return {name: tensor.cpu() for name, tensor in state.items()}
