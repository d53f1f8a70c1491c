"""A real tokenizer over real text, with no download: byte-level BPE trained on the Python
standard library's own sources, plus realistic rollout payloads built from it.

Reusable by any benchmark (``sys.path[0]`` is ``benchmarks/`` when one is run as a script)::

    from corpus import load_corpus, make_rollout
    corpus = load_corpus()            # trains once (~10-30 s), then loads from the cache
    rollout = make_rollout(corpus, rng, num_samples=16, response_tokens=2048)

The trained tokenizer and the tokenized corpus are cached under ``$DOCKYARD_CACHE_DIR``
(default ``~/.cache/dockyard``), keyed by Python version and vocabulary size.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dockyard.schemas import (
    DatasetPosition,
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleScore,
    SampleTimings,
    SamplingParams,
    ScoredRollout,
    Segment,
)

DEFAULT_VOCAB_SIZE = 32_000
#: Test suites and IDLE are left out: they are large and repetitive, not representative text.
_SKIPPED_PARTS = {"site-packages", "test", "tests", "idlelib", "lib2to3"}


@dataclass(frozen=True)
class Corpus:
    tokenizer: Tokenizer
    #: The whole corpus as one token stream (uint32), in file order.
    tokens: np.ndarray
    vocab_size: int
    source_bytes: int


def cache_dir() -> Path:
    root = Path(os.environ.get("DOCKYARD_CACHE_DIR", Path.home() / ".cache" / "dockyard"))
    path = root / "benchmarks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def stdlib_source_files() -> list[Path]:
    """The ``.py`` files of this interpreter's standard library, sorted (deterministic)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(f for f in root.rglob("*.py") if not _SKIPPED_PARTS & set(f.parts))


def _read_texts(files: list[Path]) -> list[str]:
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_corpus(vocab_size: int = DEFAULT_VOCAB_SIZE) -> Corpus:
    """The stdlib tokenizer and token stream, from the cache when present."""
    key = f"stdlib-bpe-py{sys.version_info.major}.{sys.version_info.minor}-v{vocab_size}"
    tokenizer_path = cache_dir() / f"{key}.json"
    tokens_path = cache_dir() / f"{key}.tokens.npy"
    files = stdlib_source_files()
    if tokenizer_path.exists() and tokens_path.exists():
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokens = np.load(tokens_path)
        source_bytes = sum(f.stat().st_size for f in files)
    else:
        texts = _read_texts(files)
        source_bytes = sum(len(t.encode()) for t in texts)
        started = time.perf_counter()
        tokenizer = train_tokenizer(texts, vocab_size)
        encodings = tokenizer.encode_batch(texts)
        tokens = np.concatenate([np.asarray(e.ids, dtype=np.uint32) for e in encodings])
        tokenizer.save(str(tokenizer_path))
        np.save(tokens_path, tokens)
        print(
            f"trained a {tokenizer.get_vocab_size()}-token BPE on {len(files)} stdlib files "
            f"({source_bytes / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
    return Corpus(tokenizer, tokens, tokenizer.get_vocab_size(), source_bytes)


def realistic_logprobs(rng: np.random.Generator, count: int) -> np.ndarray:
    """Behaviour log-probs as sampling at temperature 1 produces them: most tokens are
    near-certain (log p ≈ 0), a minority are uncertain, and a heavy tail is very unlikely."""
    kind = rng.random(count)
    confident = -np.abs(rng.normal(0.0, 0.02, count))
    uncertain = -rng.exponential(0.8, count)
    tail = -(2.0 + rng.pareto(1.5, count))
    logprobs = np.where(kind < 0.65, confident, np.where(kind < 0.95, uncertain, tail))
    return np.maximum(logprobs, -40.0).astype(np.float32)


def _slice(corpus: Corpus, rng: np.random.Generator, length: int) -> np.ndarray:
    start = int(rng.integers(0, corpus.tokens.shape[0] - length))
    return corpus.tokens[start : start + length].astype(np.int32)


def make_prompt_group(
    corpus: Corpus, rng: np.random.Generator, num_samples: int, prompt_tokens: int = 256
) -> PromptGroup:
    prompt = _slice(corpus, rng, prompt_tokens)
    return PromptGroup(
        group_id=f"bench-{int(rng.integers(1 << 40))}",
        prompt_token_ids=prompt,
        prompt_text=corpus.tokenizer.decode(prompt.tolist()),
        environment="code",
        agent="single_turn",
        num_generations=num_samples,
        dataset_position=DatasetPosition(dataset="stdlib", epoch=0, index=int(rng.integers(1e6))),
        ground_truth="reference answer",
        dispatch_weight_version=41,
        trace_id="bench-trace",
        created_at_unix_s=1.7e9,
    )


def make_sample(
    corpus: Corpus, rng: np.random.Generator, group: PromptGroup, index: int, length: int
) -> RolloutSample:
    response = _slice(corpus, rng, length)
    # int64, as dockyard.producers.rollout_assembly builds them from every engine's output
    versions = np.full(length, 41, dtype=np.int64)
    if rng.random() < 0.25:  # a refit landed mid-generation
        versions[int(rng.integers(length)) :] = 42
    mask = np.ones(length, dtype=np.bool_)
    segments: list[Segment] = []
    if rng.random() < 0.2:  # a tool result inserted into a multi-turn rollout
        start = int(rng.integers(length // 2))
        end = min(length, start + int(rng.integers(16, 256)))
        mask[start:end] = False
        segments = [
            Segment(role="assistant", start=0, end=start),
            Segment(role="tool", start=start, end=end),
            Segment(role="assistant", start=end, end=length),
        ]
    return RolloutSample(
        sample_index=index,
        prompt_token_ids=group.prompt_token_ids,
        response_token_ids=response,
        behaviour_logprobs=realistic_logprobs(rng, length),
        token_weight_versions=versions,
        loss_mask=mask,
        finish_reason="length" if rng.random() < 0.3 else "stop",
        sampling=SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=length, seed=index),
        engine=EngineInfo(name="vllm", version="0.32.0"),
        worker_id="rollout-worker-3",
        timings=SampleTimings(
            started_at_unix_s=1.7e9, finished_at_unix_s=1.7e9 + 12.5, time_to_first_token_s=0.08
        ),
        segments=segments,
    )


def make_rollout(
    corpus: Corpus, rng: np.random.Generator, num_samples: int, response_tokens: int
) -> Rollout:
    group = make_prompt_group(corpus, rng, num_samples)
    samples = [
        make_sample(corpus, rng, group, index, response_tokens) for index in range(num_samples)
    ]
    return Rollout(group=group, samples=samples, created_at_unix_s=1.7e9)


def make_scored_rollout(
    corpus: Corpus, rng: np.random.Generator, num_samples: int, response_tokens: int
) -> ScoredRollout:
    rollout = make_rollout(corpus, rng, num_samples, response_tokens)
    scores = [
        SampleScore(
            sample_index=sample.sample_index,
            reward=float(rng.random() < 0.4),
            reward_components={"correct": 1.0, "format": 0.5},
        )
        for sample in rollout.samples
    ]
    return ScoredRollout(rollout=rollout, scores=scores, scorer_id="scorer-0")
