"""GPU check, measurements 1 and 2: dockyard's trainer step on random Qwen2.5-shaped models.

    python benchmarks/gpu_check.py measure --only trainer --results DIR [--dry-run]

For each model (Qwen2.5-0.5B and -1.5B shapes, random init, built in code): one
``PolicyTrainer.step`` (bf16 autocast, float32 master weights, AdamW, packed micro-batches of
``mb_tokens``, the quickstart's loss without the π_old pass) on a long-tail batch of 64 samples,
against the baseline, a minimal loop written here (forward + backward + AdamW over the *same*
packed micro-batches). Then the trainer with FSDP2 on one rank (NCCL; gloo in the dry run) and
with activation checkpointing, each against the plain trainer of the same run.

Each variant is built, timed (median of ``repeats`` steps after a warm-up) and freed on its
own, so ``torch.cuda.max_memory_allocated`` is that variant's peak. Variants run one after
the other, not round-robin: a dedicated GPU is not the shared CPU the other benchmarks fight.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from gpu_check_common import (
    Sizes,
    attention_implementation,
    build_qwen2,
    device_name,
    free,
    parameter_count,
    peak_gib,
    peak_tflops,
    reset_peak,
    sizes,
    timed,
    training_batch,
    write_row,
)
from torch.distributed.device_mesh import DeviceMesh

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.batch import TrainingBatch
from dockyard.consumers.trainer.micro_batches import MicroBatch, sequence_lengths
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer

QUICKSTART = "configs/quickstart.yaml"


def overrides(size: Sizes) -> list[str]:
    return [
        "policy.precision=bfloat16",
        # π_old := sg(π_θ), no π_old pass (the quickstart's loss): the step is one forward and
        # backward per micro-batch, what the minimal loop does.
        "policy.skip_prev_logprobs=true",
        "loss_fn.force_on_policy_ratio=true",
        f"policy.max_total_sequence_length={size.longest}",
        f"policy.generation.max_new_tokens={size.longest // 2}",
        "policy.train_micro_batch_size=8",
        "policy.logprob_batch_size=8",
        f"policy.train_global_batch_size={size.samples}",
        f"grpo.num_prompts_per_step={size.samples // 8}",
        "grpo.num_generations_per_prompt=8",
        "policy.sequence_packing.enabled=true",
        f"policy.sequence_packing.train_mb_tokens={size.mb_tokens}",
        f"policy.sequence_packing.logprob_mb_tokens={size.mb_tokens}",
        "policy.scheduler.warmup_steps=0",
    ]


class MinimalLoop:
    """Forward + backward + AdamW over given micro-batches: the baseline the trainer's step is
    compared with. Its loss is a policy-gradient surrogate −A·log π with fixed random ±1
    advantages per sample (the arithmetic the trainer's loss adds is a few elementwise ops)."""

    def __init__(self, model: torch.nn.Module, plans: list[MicroBatch], dev: torch.device):
        self.model, self.plans, self.dev = model.train(), plans, dev
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
        generator = torch.Generator().manual_seed(0)
        self.weights = [
            torch.randint(0, 2, (plan.size, 1), generator=generator).float() * 2 - 1
            for plan in plans
        ]
        self.tokens = sum(plan.size * plan.columns for plan in plans)

    def logprobs(self, plan: MicroBatch) -> torch.Tensor:
        ids = plan.input_ids.to(self.dev, non_blocking=True)
        with torch.autocast(self.dev.type, dtype=torch.bfloat16):
            if plan.position_ids is not None:
                positions = plan.position_ids.to(self.dev, non_blocking=True)
                logits = self.model(input_ids=ids, position_ids=positions, use_cache=False).logits
            else:
                assert plan.attention_mask is not None
                mask = plan.attention_mask.to(self.dev, non_blocking=True)
                logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        logits = logits[:, :-1].float()
        flat = (
            logits.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        ).reshape(-1)
        if plan.gather_index is None:
            whole: torch.Tensor = flat.view(plan.size, -1)[:, : plan.columns]
            return whole
        assert plan.gather_valid is not None
        picked = flat[plan.gather_index.to(self.dev).reshape(-1)].view_as(plan.gather_index)
        masked: torch.Tensor = picked * plan.gather_valid.to(self.dev)
        return masked

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for plan, weight in zip(self.plans, self.weights, strict=True):
            loss = -(self.logprobs(plan) * weight.to(self.dev)).sum() / self.tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()


def one_rank_mesh(dev: torch.device) -> DeviceMesh:
    """A one-rank process group (NCCL on cuda, gloo on the CPU) and its 1-D device mesh: FSDP2
    then shards over one rank, which runs its whole path (all-gathers, reduce-scatters) for
    its overhead to be measured without a second GPU."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    return init_device_mesh(dev.type, (1,))


def measure(
    label: str,
    build: Callable[[], Callable[[], object]],
    dev: torch.device,
    size: Sizes,
) -> tuple[float, float | None]:
    reset_peak(dev)
    step = build()
    seconds = timed(step, dev, size.repeats)
    peak = peak_gib(dev)
    del step
    free(dev)
    print(f"{label}: {seconds:.3f} s", flush=True)
    return seconds, peak


def run_model(
    name: str, size: Sizes, dev: torch.device, batch: TrainingBatch, results: Path
) -> None:
    base = overrides(size)
    gpu = device_name(dev)
    peak = peak_tflops(gpu) if dev.type == "cuda" else None
    real = sum(sequence_lengths(batch))
    params = parameter_count(build_qwen2(name, size.shapes, torch.device("meta")))

    def trainer(extra: list[str], sharded: bool = False) -> Callable[[], Callable[[], object]]:
        def build() -> Callable[[], object]:
            config = load_config(QUICKSTART, base + extra)
            mesh = one_rank_mesh(dev) if sharded else None
            policy = PolicyTrainer(build_qwen2(name, size.shapes, dev), config, dev, mesh=mesh)
            return lambda: policy.step(batch)

        return build

    def minimal() -> Callable[[], object]:
        config = load_config(QUICKSTART, base)
        model = build_qwen2(name, size.shapes, dev)
        # The trainer's own packed layout of this batch: the same forward passes.
        plans = PolicyTrainer(model, config, dev).plan(batch, "train")
        return MinimalLoop(model, plans, dev)

    variants = {
        "trainer": trainer([]),
        "minimal": minimal,
        "fsdp2": trainer([], sharded=True),
        "activation_checkpointing": trainer(["policy.dtensor_cfg.activation_checkpointing=true"]),
    }
    times = {
        label: measure(f"{name} {label}", build, dev, size) for label, build in variants.items()
    }
    for label, (seconds, peak_memory) in times.items():
        tokens_per_s = real / seconds
        achieved = 6 * params * tokens_per_s / 1e12
        baseline = "minimal" if label in ("trainer", "minimal") else "trainer"
        write_row(
            results,
            "trainer_step",
            model=name,
            variant=label,
            params=params,
            device=gpu,
            real_tokens=real,
            samples=batch.size,
            mb_tokens=size.mb_tokens,
            step_s=seconds,
            tokens_per_s=tokens_per_s,
            model_tflops=achieved,
            mfu=achieved / peak if peak else None,
            peak_tflops=peak,
            peak_memory_gib=peak_memory,
            baseline=baseline,
            vs_baseline=seconds / times[baseline][0],
            attention=attention_implementation(dev),
        )


def run(results: Path, dev: torch.device, dry_run: bool) -> None:
    size = sizes(dry_run)
    for name, shape in size.shapes.items():
        batch = training_batch(shape["vocab_size"], size.samples, size.longest)
        run_model(name, size, dev, batch, results)
    if dist.is_initialized():
        dist.destroy_process_group()
