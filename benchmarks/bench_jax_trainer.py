"""The JAX trainer backend's GRPO step against the torch trainer's, on the quickstart batch.

    python benchmarks/bench_jax_trainer.py [--repeats 5] [--write-docs]

The quickstart's policy (``tiny://qwen2-arithmetic``, float32), config and batch (32 prompts ×
16 samples, the model's own log-probs as behaviour log-probs: ``bench_trainer_step.py``'s
``quickstart_batch``); ``PolicyTrainer.step`` (torch) and ``JaxPolicyTrainer.step``
(``policy.jax_cfg.enabled=true``) each train a copy of the same model on it. Both steps include
the whole of what the loop calls: π_old, filters, advantages, micro-batched loss and gradients,
clip, AdamW, schedule — and for JAX, copying the new weights into the torch mirror the loop
publishes from.

Compile time is reported apart: the JAX trainer's first step (tracing and XLA compilation of its
three programs, then one step) minus its median step. Steady steps are medians of
``--repeats`` after that warm-up, the two backends round-robin in one run.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import time
from datetime import date

import numpy as np
import torch
from bench_trainer_step import QUICKSTART, quickstart_batch, round_robin

from dockyard.config.loader import load_config
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer
from dockyard.models import load_policy

JAX_ON = ["policy.dtensor_cfg.enabled=false", "policy.jax_cfg.enabled=true"]


def measure(repeats: int) -> tuple[list[str], dict[str, float]]:
    from dockyard.consumers.trainer.jax_backend.trainer import JaxPolicyTrainer

    torch_config = load_config(QUICKSTART)
    jax_config = load_config(QUICKSTART, JAX_ON)
    model, tokenizer = load_policy(torch_config.policy.model_name, "float32")
    batch = quickstart_batch(tokenizer, model, np.random.default_rng(0))
    torch_trainer = PolicyTrainer(copy.deepcopy(model), torch_config)
    jax_trainer = JaxPolicyTrainer(copy.deepcopy(model), jax_config)

    started = time.perf_counter()
    jax_trainer.step(batch)
    first_jax = time.perf_counter() - started
    times = round_robin(
        {"torch": lambda: torch_trainer.step(batch), "jax": lambda: jax_trainer.step(batch)},
        repeats,
    )
    compile_s = first_jax - times["jax"]
    policy = torch_config.policy
    lines = [
        f"{batch.size} samples, {batch.num_response_tokens:,} response tokens, micro-batches "
        f"{policy.logprob_batch_size} (log-probs) / {policy.train_micro_batch_size} (train).",
        "",
        "| backend | step ms (median) | vs torch |",
        "|---|---:|---:|",
        f"| torch (`PolicyTrainer`) | {times['torch'] * 1e3:.0f} | **1.00×** |",
        f"| JAX (`JaxPolicyTrainer`, jit) | {times['jax'] * 1e3:.0f} | "
        f"**{times['torch'] / times['jax']:.2f}×** |",
        "",
        f"JAX compile time (first step − median step): **{compile_s:.1f} s**, once per batch "
        f"shape (first step {first_jax:.1f} s).",
    ]
    return lines, {**times, "compile": compile_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for both backends (default: each library's own choice); 1 makes "
        "torch and XLA single-threaded, the fair setting on an oversubscribed machine",
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        if args.threads == 1:  # read when jax is first imported, just below
            os.environ["XLA_FLAGS"] = (
                "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
            )
    import jax

    torch.manual_seed(0)
    header = (
        f"`python benchmarks/bench_jax_trainer.py --repeats {args.repeats}"
        f"{'' if args.threads is None else f' --threads {args.threads}'} --write-docs` — "
        f"{date.today()}, Python "
        f"{platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads), jax {jax.__version__} ({jax.devices()[0].platform}), "
        f"{os.cpu_count()} CPUs shared (load average {os.getloadavg()[0]:.0f} at the start); "
        f"{'XLA single-threaded; ' if args.threads == 1 else ''}"
        f"medians of {args.repeats} steps after a warm-up, "
        'round-robin. "vs torch" is torch step time / JAX step time (above 1: JAX faster).'
    )
    lines, _ = measure(args.repeats)
    print(header, "", *lines, sep="\n")
    if args.write_docs:
        from report import replace_section

        replace_section("trainer-step", [header, "", *lines], subsection="JAX backend vs torch")


if __name__ == "__main__":
    main()
