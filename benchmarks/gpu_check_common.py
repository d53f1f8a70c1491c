"""What the GPU check's measurements share: sizes, models, the batch, timing and result rows.

The check (``scripts/gpu_check.sh``) runs each measurement in its own process
(``benchmarks/gpu_check_*.py``); each appends JSON rows to ``RESULTS/rows.jsonl`` and
``benchmarks/gpu_check_report.py`` turns them into the Markdown block for docs/benchmarks.md.
``--dry-run`` runs the same code on the CPU at toy sizes (a test runs it), so that the minutes
of a GPU machine go to measuring, not to finding bugs.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from transformers import Qwen2ForCausalLM

    from dockyard.consumers.trainer.batch import TrainingBatch

ROWS_FILE = "rows.jsonl"

#: Dense bf16 peak (TFLOPS, no sparsity) by a substring of ``torch.cuda.get_device_name()``.
#: NVIDIA's data sheets: H100 / H200 SXM 989, A100 312. Unknown GPUs get no MFU (said so).
PEAK_BF16_TFLOPS: dict[str, float] = {"H200": 989.0, "H100": 989.0, "A100": 312.0}

#: The published Qwen2.5-0.5B / 1.5B shapes (their config.json on the Hugging Face hub); the
#: weights are random: the check measures speed, not quality, and carries no download.
QWEN25_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
}

#: --dry-run: the same two names, a few M parameters each (the path, not the speed, is checked).
TOY_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8192,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8192,
        tie_word_embeddings=True,
    ),
}


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is: the GPU's sizes fit the check in ≤ 8 minutes on an H200."""

    shapes: dict[str, dict[str, Any]]
    samples: int  # samples per trainer step (groups of 8)
    longest: int  # tokens of the longest sample
    mb_tokens: int  # packed micro-batch budget (tokens)
    repeats: int  # timed steps after one warm-up
    patch_steps: int
    quickstart_steps: int


GPU_SIZES = Sizes(
    QWEN25_SHAPES,
    samples=64,
    longest=2048,
    mb_tokens=8192,
    repeats=3,
    patch_steps=2,
    quickstart_steps=60,
)
DRY_SIZES = Sizes(
    TOY_SHAPES, samples=8, longest=32, mb_tokens=128, repeats=1, patch_steps=1, quickstart_steps=3
)


def sizes(dry_run: bool) -> Sizes:
    return DRY_SIZES if dry_run else GPU_SIZES


def device(dry_run: bool) -> torch.device:
    if dry_run:
        # One compute thread: the dry run checks the path on a shared CPU, where torch's
        # default pool spins against the other jobs (docs/benchmarks.md, threads per role).
        torch.set_num_threads(1)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch (use --dry-run on a CPU machine)")
    return torch.device("cuda", 0)


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def peak_tflops(name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def attention_implementation(dev: torch.device) -> str:
    """flash-attention where installed (packed rows are then varlen, docs/trainer.md); else
    SDPA, which masks whole packed rows block-diagonally (slower on long rows, said in the
    report)."""
    import importlib.util

    if dev.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def build_qwen2(
    name: str, shapes: dict[str, dict[str, Any]], dev: torch.device, seed: int = 0
) -> Qwen2ForCausalLM:
    """A random-initialised Qwen2ForCausalLM in float32 (the trainer's master weights), built
    on ``dev`` directly: initialising 1.5B parameters on the CPU first takes minutes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    # The shapes set the cost; the rotary base and context length do not (left at defaults
    # but for the context, which must hold the longest packed row).
    config = Qwen2Config(**shapes[name], max_position_embeddings=32768)
    config._attn_implementation = attention_implementation(dev)
    with dev:
        model: Qwen2ForCausalLM = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    return model.float()  # type: ignore[no-untyped-call,no-any-return]


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied head counted once), as the model FLOPs 6·N·tokens use."""
    return sum(p.numel() for p in model.parameters())


def long_tail_lengths(
    rng: np.random.Generator, samples: int, longest: int
) -> list[tuple[int, int]]:
    """(prompt, response) lengths: log-normal, median response ≈ longest/6 with a tail to the
    longest, the shape RL rollouts have (as bench_trainer_step's layouts)."""
    out = []
    for _ in range(samples):
        prompt = int(np.clip(rng.lognormal(np.log(max(8, longest // 16)), 0.5), 4, longest // 4))
        response = int(np.clip(rng.lognormal(np.log(longest / 6), 0.9), 1, longest - prompt))
        out.append((prompt, response))
    return out


def training_batch(vocab: int, samples: int, longest: int, seed: int = 1) -> TrainingBatch:
    """A TrainingBatch of random tokens in groups of 8 (rewards 0/1), long-tail lengths.

    Behaviour log-probs are zeros: with π_old := sg(π_θ) and no importance-sampling correction
    (the quickstart's loss) they only feed metrics, and computing the model's own would need a
    whole-batch forward whose float32 logits do not fit for a 150k vocabulary."""
    from bench_trainer_step import scored_group

    from dockyard.consumers.trainer.batch import build_batch

    rng = np.random.default_rng(seed)
    lengths = long_tail_lengths(rng, samples, longest)
    groups = []
    for g in range(samples // 8):
        prompt_length = lengths[8 * g][0]
        prompt = [int(t) for t in rng.integers(1, vocab, size=prompt_length)]
        responses = [
            [int(t) for t in rng.integers(1, vocab, size=lengths[8 * g + i][1])] for i in range(8)
        ]
        groups.append(scored_group(f"g{g}", prompt, responses, rng))
    return build_batch(groups, 0)


def synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(step: Callable[[], object], dev: torch.device, repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up (kernel selection, allocator)."""
    step()
    synchronize(dev)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        synchronize(dev)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gib(dev: torch.device) -> float | None:
    """torch.cuda.max_memory_allocated since :func:`reset_peak`; None on the CPU."""
    return torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None


def free(dev: torch.device) -> None:
    import gc

    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def write_row(results: Path, measurement: str, **fields: Any) -> None:
    """Append one result row (one JSON object per line; the report reads them all)."""
    results.mkdir(parents=True, exist_ok=True)
    row = {"measurement": measurement, **fields}
    with (results / ROWS_FILE).open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def read_rows(results: Path) -> list[dict[str, Any]]:
    path = results / ROWS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
