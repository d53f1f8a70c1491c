"""ClippedPGLoss (forward + backward) on 64 × 4,096 tokens next to a plain cross-entropy.

Both paths start from the same logits ``[64, 4096, V]`` and pay the same ``log_softmax`` over
the vocabulary; the GRPO path then gathers the sampled tokens' log-probs and runs the full loss
(PPO clip + dual clip, token IS correction with ``tis``, k3 reference KL, metrics). A third row
times the loss alone on ``[64, 4096]`` log-probs, i.e. what the loss adds on top of the model.

    python benchmarks/bench_loss.py [--vocab 1024] [--repeats 3]

The vocabulary is CPU-sized (logits for 262k tokens × V floats); the loss itself never touches
the vocabulary dimension, so its cost does not grow with V.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from dockyard.algorithms.loss import ClippedPGLoss, GlobalCounts, LossInputs
from dockyard.config.sections.loss import ClippedPGLossConfig

BATCH, TOKENS = 64, 4096


def timed(step: Callable[[], None], repeats: int) -> float:
    step()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)

    logits = torch.randn(BATCH, TOKENS, args.vocab, requires_grad=True)
    targets = torch.randint(0, args.vocab, (BATCH, TOKENS))
    lengths = torch.randint(TOKENS // 4, TOKENS + 1, (BATCH,))
    token_mask = (torch.arange(TOKENS) < lengths.unsqueeze(-1)).float()
    sample_mask = torch.ones(BATCH)
    with torch.no_grad():
        sampled = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    prev = sampled + 0.05 * torch.randn_like(sampled)
    gen = prev + 0.05 * torch.randn_like(sampled)
    ref = prev + 0.1 * torch.randn_like(sampled)
    advantages = torch.randn(BATCH)
    counts = GlobalCounts.from_batch(token_mask, sample_mask)
    loss_fn = ClippedPGLoss(
        ClippedPGLossConfig(
            ratio_clip_c=3.0,
            reference_policy_kl_penalty=0.01,
            use_importance_sampling_correction=True,
            truncated_importance_sampling_type="tis",
            truncated_importance_sampling_ratio=2.0,
        )
    )

    def inputs(logprobs: torch.Tensor) -> LossInputs:
        return LossInputs(logprobs, prev, gen, advantages, token_mask, sample_mask, ref)

    def cross_entropy() -> None:
        logits.grad = None
        loss = F.cross_entropy(
            logits.view(-1, args.vocab), targets.view(-1), reduction="none"
        ).view(BATCH, TOKENS)
        ((loss * token_mask).sum() / token_mask.sum()).backward()

    def grpo_from_logits() -> None:
        logits.grad = None
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss, _ = loss_fn(inputs(logprobs), counts)
        loss.backward()

    leaf = sampled.clone().requires_grad_(True)

    def grpo_loss_only() -> None:
        leaf.grad = None
        loss, _ = loss_fn(inputs(leaf), counts)
        loss.backward()

    baseline = timed(cross_entropy, args.repeats)
    rows = [
        ("cross-entropy (baseline)", baseline),
        ("ClippedPGLoss from logits", timed(grpo_from_logits, args.repeats)),
        ("ClippedPGLoss on log-probs only", timed(grpo_loss_only, args.repeats)),
    ]
    print(
        f"loss fwd+bwd, {BATCH} × {TOKENS} tokens, vocab {args.vocab}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"{'path':<34}{'seconds':>10}{'× baseline':>12}")
    for name, seconds in rows:
        print(f"{name:<34}{seconds:>10.3f}{seconds / baseline:>12.2f}")


if __name__ == "__main__":
    main()
