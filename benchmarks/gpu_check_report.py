"""The GPU check's Markdown block, from the rows its measurements wrote (gpu_check_common).

The block is what docs/benchmarks.md's "On a GPU" section takes, pasted as it is. Every table
holds the baseline its ratio is against; a measurement that failed is listed with its error,
and every expected row the results lack is named (the dry run's test checks that none is).
"""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

#: Each measurement's rows in the block: (measurement, what identifies a row). The dry-run
#: test reads this too, so a row dropped from the check fails it.
EXPECTED: list[tuple[str, dict[str, str]]] = [
    *[
        ("trainer_step", {"model": model, "variant": variant})
        for model in ("qwen2.5-0.5b", "qwen2.5-1.5b")
        for variant in ("trainer", "minimal", "fsdp2", "activation_checkpointing")
    ],
    ("weight_patch", {"model": "qwen2.5-1.5b"}),
    ("quickstart", {}),
    ("tests", {}),
]

PUBLISHED = [
    "Published per-GPU figures to compare with: NeMo-RL's performance summary "
    "(https://docs.nvidia.com/nemo/rl/latest/about/performance-summary.html) defines "
    "Tokens/sec/GPU per stage and training MFU and publishes them for its Megatron backend on "
    "DGX-H100, for models larger than these two; the search tool reached that page's "
    "definitions but not its table, so no NeMo-RL figure is quoted here. No per-GPU figure of "
    "verl's was found through the search tool. Both would be whole GRPO steps (generation "
    "with vLLM included) on 8+ GPUs, not one trainer step on one GPU: they compare with the "
    "tokens/s and MFU rows only, and only roughly.",
]


def read_rows(results: Path) -> list[dict[str, Any]]:
    """gpu_check_common.read_rows without importing torch (which that module does)."""
    path = results / "rows.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def missing_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The EXPECTED rows no result row matches, as ``measurement key=value ...``."""
    absent = []
    for measurement, keys in EXPECTED:
        if not any(
            r["measurement"] == measurement and all(r.get(k) == v for k, v in keys.items())
            for r in rows
        ):
            absent.append(" ".join([measurement, *(f"{k}={v}" for k, v in keys.items())]))
    return absent


def _f(value: float | None, spec: str, none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def trainer_lines(rows: list[dict[str, Any]]) -> list[str]:
    step = [r for r in rows if r["measurement"] == "trainer_step"]
    if not step:
        return []
    first = step[0]
    mfu_note = (
        f"MFU = 6 · parameters · tokens/s ÷ the dense bf16 peak of the {first['device']} "
        f"({first['peak_tflops']:.0f} TFLOPS); 6·N·T counts the matmuls only (no attention "
        "FLOPs, no recomputation)."
        if first["peak_tflops"]
        else f"No MFU: no dense bf16 peak is known for `{first['device']}` "
        "(gpu_check_common.PEAK_BF16_TFLOPS)."
    )
    lines = [
        "### Trainer step (bf16 autocast, float32 master weights, packed micro-batches)",
        "",
        f"Random-initialised Qwen2 models with the published Qwen2.5 shapes; "
        f"{first['samples']} samples (groups of 8, long-tail lengths), {first['real_tokens']:,} "
        f"real tokens, packed rows of {first['mb_tokens']:,} tokens, attention "
        f"`{first['attention']}`; medians of timed steps after a warm-up, each variant built, "
        "timed and freed on its own (peak memory is its own). Baselines in the same run: the "
        "minimal loop (forward + backward + AdamW over the trainer's own packed micro-batches) "
        "for the trainer; the plain trainer for FSDP2 (one rank) and activation checkpointing. "
        + mfu_note,
        "",
        "| model | params | variant | step s | tokens/s | MFU | peak memory GiB | baseline "
        "| step ÷ baseline |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in step:
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:,.1f}M | {r['variant']} | {r['step_s']:.3f} | "
            f"{r['tokens_per_s']:,.0f} | {_f(r['mfu'], '.1%')} | "
            f"{_f(r['peak_memory_gib'], '.1f')} | {r['baseline']} | "
            f"**{r['vs_baseline']:.2f}×** |"
        )
    return lines


def patch_lines(rows: list[dict[str, Any]]) -> list[str]:
    patches = [r for r in rows if r["measurement"] == "weight_patch"]
    if not patches:
        return []
    lines = [
        "### Sparse weight patches of the 1.5B model",
        "",
        "bench_weight_patches.py's trajectory on the training device (float32 master weights, "
        f"AdamW at lr {patches[0]['lr']:g}, bf16 published weights as the device holds them); "
        "GB/s are the "
        "model's bf16 bytes per second, the device-to-host copy included (the patch code is "
        "numpy on the host). Baseline in the same run: the full snapshot (safetensors).",
        "",
        "| step | elements changed | patch bytes | full bytes | encode GB/s (incl. digest) | "
        "apply GB/s (incl. digest) | snapshot GB/s | bit-identical |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in patches:
        lines.append(
            f"| {r['step']} | {r['changed']:.3%} | {r['patch_bytes']:,} | {r['full_bytes']:,} | "
            f"{r['encode_gb_s']:.2f} | {r['apply_gb_s']:.2f} | {r['snapshot_gb_s']:.2f} | "
            f"{'yes' if r['identical'] else 'NO'} |"
        )
    return lines


def quickstart_lines(rows: list[dict[str, Any]]) -> list[str]:
    runs = [r for r in rows if r["measurement"] == "quickstart"]
    if not runs:
        return []
    r = runs[0]
    return [
        "### The quickstart end to end (torch engine)",
        "",
        f"`python {r['command']}`; the trainer's `trainer.placement` said "
        f"`{r['trainer_device']}`. The rollout engine is the torch one: vLLM's CUDA wheel is "
        'too large to carry to a machine without network. Baseline: the CPU figure of "The '
        f'main job" above (≈ {r["cpu_steps_per_s"]:.1f} GRPO steps/s on 2 cores).',
        "",
        "| GRPO steps | wall s (incl. start) | steps/s (steady state) | CPU steps/s | vs CPU |",
        "|---:|---:|---:|---:|---:|",
        f"| {r['steps']} | {r['wall_s']:.0f} | {r['steps_per_s']:.2f} | "
        f"{r['cpu_steps_per_s']:.2f} | **{r['vs_cpu']:.2f}×** |",
    ]


def test_lines(rows: list[dict[str, Any]]) -> list[str]:
    runs = [r for r in rows if r["measurement"] == "tests"]
    if not runs:
        return []
    r = runs[0]
    return [
        "### Packing, precision and loss-equality tests",
        "",
        f"{r['mode']}: `{'`, `'.join(r['files'])}` — **{r['summary']}** ({r['seconds']:.0f} s). "
        "The trainer tests run on the training device (cuda:0 on a GPU); the loss tests build "
        "their tensors on the CPU.",
    ]


def write_report(results: Path, out: Path, dry_run: bool) -> int:
    rows = read_rows(results)
    failed = [r for r in rows if r["measurement"] == "failed"]
    absent = missing_rows(rows)
    # From the rows and the package metadata: importing torch here would cost the dry run
    # seconds it has not got on a loaded CPU.
    gpu = next((r["device"] for r in rows if "device" in r), "device unknown")
    torch_version = version("torch")
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        "**Dry run on the CPU (toy models: the figures check the path, not the speed)** — "
        if dry_run
        else ""
    ) + (
        f"`scripts/gpu_check.sh{' --dry-run' if dry_run else ''}` — {when}, {gpu}, Python "
        f"{platform.python_version()}, torch {torch_version}."
    )
    lines = [header, ""]
    for part in (trainer_lines, patch_lines, quickstart_lines, test_lines):
        block = part(rows)
        if block:
            lines += [*block, ""]
    lines += PUBLISHED
    if failed or absent:
        lines += ["", "**Not measured:**", ""]
        lines += [f"- `{r['step']}` failed: {r['error']}" for r in failed]
        lines += [f"- no row for `{name}`" for name in absent]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip("\n") + "\n")
    print(out.read_text())
    return 1 if failed or absent else 0
