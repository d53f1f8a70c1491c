"""Codec benchmark: dockyard's msgpack+zstd against raw zstd, pickle+zstd and JSON.

    python benchmarks/bench_codec.py [--write-docs]

Payloads are rollout groups (16 × 2,048 and 64 × 8,192 response tokens) whose token ids come
from a byte-level BPE trained on the Python standard library and applied to its sources (see
``corpus.py``), with heavy-tailed behaviour log-probs. Throughput is MB/s of the *logical*
payload: the arrays as ``dockyard.producers.rollout_assembly`` holds them (int32 token ids,
int64 weight versions, float32 log-probs, bool mask), the same bytes the raw-zstd baseline
compresses. A second baseline compresses exactly the array section the codec writes (after
dtype narrowing), so the codec's own overhead (msgpack, checks, layout) is visible separately
from the gain of narrowing.

A second table measures cheap array transforms (narrowing, byte-shuffle, delta coding) on the
arrays alone, to decide which ones the wire format keeps.
"""

from __future__ import annotations

import argparse
import datetime
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import zstandard
from corpus import Corpus, load_corpus, make_rollout
from report import replace_section

from dockyard.schemas import Rollout, decode, encode
from dockyard.schemas.frames import ZSTD_LEVEL, compress_with_stored_tail

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
CASES = (("16 × 2048", 16, 2048), ("64 × 8192", 64, 8192))
LEVELS = (1, 3)
MB = 1e6


def timed(fn: Callable[[], object], min_seconds: float = 0.25, max_reps: int = 400) -> float:
    """Median seconds per call (after one warm-up call)."""
    fn()
    samples: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < max_reps):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def producer_arrays(rollout: Rollout) -> list[np.ndarray]:
    arrays: list[np.ndarray] = []
    for sample in rollout.samples:
        arrays += [
            sample.prompt_token_ids,
            sample.response_token_ids,
            sample.behaviour_logprobs,
            sample.token_weight_versions,
            sample.loss_mask,
        ]
    return arrays


def wire_array_section(rollout: Rollout) -> bytes:
    """The exact array bytes the codec compresses (narrowed, grouped by field, shared arrays
    once), for the same-bytes baseline."""
    from dockyard.schemas.layout import lay_out

    return lay_out(rollout)[1].array_section()


@dataclass
class Row:
    case: str
    method: str
    level: str
    logical_bytes: int
    wire_bytes: int
    encode_s: float
    decode_s: float

    @property
    def ratio(self) -> float:
        return self.logical_bytes / self.wire_bytes

    def mbps(self, seconds: float) -> float:
        return self.logical_bytes / seconds / MB

    @property
    def roundtrip_mbps(self) -> float:
        return self.mbps(self.encode_s + self.decode_s)


def zstd_pair(level: int) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    return (
        zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=True),
        zstandard.ZstdDecompressor(),
    )


def timed_interleaved(
    fns: dict[str, Callable[[], object]], seconds: float, min_rounds: int = 5
) -> dict[str, float]:
    """Median seconds per call of each function, run round-robin so that the load of a shared
    machine hits every method alike (ratios stay meaningful when absolute times drift)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < min_rounds or (time.perf_counter() < deadline and rounds < 1000):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
        rounds += 1
    return {name: statistics.median(values) for name, values in samples.items()}


def measure_case(name: str, rollout: Rollout, seconds: float, json_seconds: float) -> list[Row]:
    arrays = producer_arrays(rollout)
    logical = b"".join(a.tobytes() for a in arrays)
    wire_section = wire_array_section(rollout)
    fns: dict[str, Callable[[], object]] = {}
    sizes: dict[str, int] = {}
    for level in LEVELS:
        encoded = encode(rollout, level=level)
        assert decode(encoded.headers, encoded.payload) == rollout
        sizes[f"dockyard codec|{level}"] = len(encoded.payload)
        fns[f"dockyard codec|{level}|enc"] = lambda level=level: encode(rollout, level=level)
        fns[f"dockyard codec|{level}|dec"] = lambda e=encoded: decode(e.headers, e.payload)
        compressor, decompressor = zstd_pair(level)
        for label, raw in (
            ("raw zstd, producer dtypes", logical),
            ("raw zstd, wire bytes", wire_section),
        ):
            # The baselines get their bytes already concatenated; the codec gathers them.
            frame = compressor.compress(raw)
            sizes[f"{label}|{level}"] = len(frame)
            fns[f"{label}|{level}|enc"] = lambda raw=raw, c=compressor: c.compress(raw)
            fns[f"{label}|{level}|dec"] = lambda f=frame, d=decompressor: d.decompress(f)
    compressor, decompressor = zstd_pair(ZSTD_LEVEL)
    pickled = compressor.compress(pickle.dumps(rollout, protocol=5))
    sizes[f"pickle + zstd|{ZSTD_LEVEL}"] = len(pickled)
    fns[f"pickle + zstd|{ZSTD_LEVEL}|enc"] = lambda: compressor.compress(
        pickle.dumps(rollout, protocol=5)
    )
    fns[f"pickle + zstd|{ZSTD_LEVEL}|dec"] = lambda: pickle.loads(decompressor.decompress(pickled))
    times = timed_interleaved(fns, seconds)

    as_json = json_encode(rollout)
    assert json_decode(as_json) == rollout
    sizes["JSON (msgspec)|-"] = len(as_json)
    times |= timed_interleaved(
        {
            "JSON (msgspec)|-|enc": lambda: json_encode(rollout),
            "JSON (msgspec)|-|dec": lambda: json_decode(as_json),
        },
        json_seconds,
        min_rounds=1,
    )
    rows = []
    for key, wire_bytes in sizes.items():
        method, level = key.split("|")
        rows.append(
            Row(
                name,
                method,
                level,
                len(logical),
                wire_bytes,
                times[f"{key}|enc"],
                times[f"{key}|dec"],
            )
        )
    return rows


def json_encode(rollout: Rollout) -> bytes:
    """The group as JSON (arrays as lists of numbers): the text baseline."""
    return msgspec.json.encode(rollout, enc_hook=lambda arr: arr.tolist())


def json_decode(text: bytes) -> Rollout:
    return msgspec.json.decode(text, type=Rollout, dec_hook=lambda _type, value: np.array(value))


def zero_copy(rollout: Rollout) -> bool:
    """Do decoded arrays view the decompressed buffer (no copy of array data)?"""
    decoded = decode(None, encode(rollout).payload)
    sample = decoded.samples[0]
    owners = set()
    for arr in (sample.response_token_ids, sample.behaviour_logprobs, sample.loss_mask):
        base = arr.base
        while isinstance(base, np.ndarray):
            base = base.base
        if not isinstance(base, memoryview) or arr.flags.writeable or arr.flags.owndata:
            return False
        owners.add(id(base.obj))
    return len(owners) == 1


# ----------------------------------------------------------------------------- transforms


def byte_shuffle(arr: np.ndarray) -> np.ndarray:
    return arr.view(np.uint8).reshape(-1, arr.dtype.itemsize).T.copy()


def byte_unshuffle(raw: bytes, dtype: np.dtype) -> np.ndarray:
    planes = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, -1)
    return planes.T.copy().view(dtype).reshape(-1)


def zigzag_delta(arr: np.ndarray) -> np.ndarray:
    diff = np.diff(arr.astype(np.int32), prepend=np.int32(0))
    return ((diff << 1) ^ (diff >> 31)).astype(np.uint32)


def undo_zigzag_delta(raw: bytes) -> np.ndarray:
    z = np.frombuffer(raw, np.uint32).astype(np.int64)
    return np.cumsum((z >> 1) ^ -(z & 1)).astype(np.int32)


@dataclass
class TransformRow:
    array: str
    transform: str
    level: int
    logical_bytes: int
    wire_bytes: int
    seconds: float
    zero_copy: bool

    @property
    def ratio(self) -> float:
        return self.logical_bytes / self.wire_bytes

    @property
    def mbps(self) -> float:
        return self.logical_bytes / self.seconds / MB

    @property
    def score(self) -> float:
        return self.ratio * self.mbps


def measure_transforms(rollout: Rollout) -> list[TransformRow]:
    tokens = np.concatenate([s.response_token_ids for s in rollout.samples]).astype(np.int32)
    logprobs = np.concatenate([s.behaviour_logprobs for s in rollout.samples])
    u16 = tokens.astype(np.uint16)
    variants: list[tuple[str, str, np.ndarray, Callable[[bytes], object], bool]] = [
        ("token ids", "none (int32)", tokens, lambda b: np.frombuffer(b, np.int32), True),
        ("token ids", "narrow to uint16", u16, lambda b: np.frombuffer(b, np.uint16), True),
        (
            "token ids",
            "uint16 + byte-shuffle",
            byte_shuffle(u16),
            lambda b: byte_unshuffle(b, np.dtype(np.uint16)),
            False,
        ),
        ("token ids", "delta + zigzag (uint32)", zigzag_delta(tokens), undo_zigzag_delta, False),
        ("log-probs", "none (float32)", logprobs, lambda b: np.frombuffer(b, np.float32), True),
        (
            "log-probs",
            "byte-shuffle",
            byte_shuffle(logprobs),
            lambda b: byte_unshuffle(b, np.dtype(np.float32)),
            False,
        ),
    ]
    rows: list[TransformRow] = []
    for level in LEVELS:
        compressor, decompressor = zstd_pair(level)
        for array, label, transformed, undo, is_zero_copy in variants:
            raw = transformed.tobytes()
            frame = compressor.compress(raw)
            assert np.array_equal(
                np.asarray(undo(decompressor.decompress(frame))),
                tokens if array == "token ids" else logprobs,
            )
            original = tokens if array == "token ids" else logprobs
            forward = {
                "narrow to uint16": lambda o=original: o.astype(np.uint16),
                "uint16 + byte-shuffle": lambda o=original: byte_shuffle(o.astype(np.uint16)),
                "delta + zigzag (uint32)": lambda o=original: zigzag_delta(o),
                "byte-shuffle": lambda o=original: byte_shuffle(o),
            }.get(label, lambda o=original: o)

            def roundtrip(forward=forward, undo=undo, c=compressor, d=decompressor) -> None:
                undo(d.decompress(c.compress(forward().tobytes())))

            rows.append(
                TransformRow(
                    array,
                    label,
                    level,
                    original.nbytes,
                    len(frame),
                    timed(roundtrip),
                    is_zero_copy,
                )
            )
        # What the codec does with float arrays: a frame whose content ends in raw blocks.
        stored = compress_with_stored_tail(b"", [logprobs], logprobs.nbytes, level)
        assert np.array_equal(np.frombuffer(decompressor.decompress(stored), np.float32), logprobs)
        rows.append(
            TransformRow(
                "log-probs",
                "stored (zstd raw blocks)",
                level,
                logprobs.nbytes,
                len(stored),
                timed(
                    lambda d=decompressor, level=level: np.frombuffer(
                        d.decompress(
                            compress_with_stored_tail(b"", [logprobs], logprobs.nbytes, level)
                        ),
                        np.float32,
                    )
                ),
                True,
            )
        )
    return rows


# ----------------------------------------------------------------------------- reporting


def codec_table(rows: list[Row]) -> list[str]:
    lines = [
        "| payload | method | zstd level | wire bytes | ratio | encode MB/s | decode MB/s "
        "| enc+dec MB/s | vs raw zstd (producer dtypes) | vs raw zstd (wire bytes) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        same_level = [r for r in rows if r.case == row.case and r.level == row.level]
        base_producer = next(
            (r for r in same_level if r.method == "raw zstd, producer dtypes"), None
        )
        base_wire = next((r for r in same_level if r.method == "raw zstd, wire bytes"), None)
        vs_producer = (
            f"{row.roundtrip_mbps / base_producer.roundtrip_mbps:.2f}×" if base_producer else "-"
        )
        vs_wire = f"{row.roundtrip_mbps / base_wire.roundtrip_mbps:.2f}×" if base_wire else "-"
        lines.append(
            f"| {row.case} | {row.method} | {row.level} | {row.wire_bytes:,} | {row.ratio:.2f} "
            f"| {row.mbps(row.encode_s):,.0f} | {row.mbps(row.decode_s):,.0f} "
            f"| {row.roundtrip_mbps:,.0f} | {vs_producer} | {vs_wire} |"
        )
    return lines


def transform_table(rows: list[TransformRow]) -> list[str]:
    lines = [
        "| array | transform | zstd level | ratio | round trip MB/s | ratio × MB/s "
        "| vs none | zero-copy decode |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        none = next(
            r
            for r in rows
            if r.array == row.array and r.level == row.level and r.transform.startswith("none")
        )
        lines.append(
            f"| {row.array} | {row.transform} | {row.level} | {row.ratio:.2f} | {row.mbps:,.0f} "
            f"| {row.score:,.0f} | {row.score / none.score:.2f}× "
            f"| {'yes' if row.zero_copy else 'no'} |"
        )
    return lines


def write_docs(body: list[str]) -> None:
    replace_section("codec", body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    started = time.perf_counter()
    corpus: Corpus = load_corpus()
    rng = np.random.default_rng(2024)
    rows: list[Row] = []
    transforms: list[TransformRow] = []
    copy_free = True
    for name, samples, tokens in CASES:
        rollout = make_rollout(corpus, rng, samples, tokens)
        small = samples * tokens <= 16 * 2048
        rows += measure_case(name, rollout, seconds=4.0 if small else 12.0, json_seconds=0.5)
        copy_free = copy_free and zero_copy(rollout)
        if name == CASES[-1][0]:
            transforms = measure_transforms(rollout)
    elapsed = time.perf_counter() - started
    table = codec_table(rows)
    ttable = transform_table(transforms)
    machine = f"Python {sys.version.split()[0]}, zstandard {zstandard.__version__}, one thread"
    print("\n".join(table))
    print()
    print("\n".join(ttable))
    print(f"\nzero-copy decode of arrays: {'yes' if copy_free else 'NO'}; {elapsed:.0f} s")
    if args.write_docs:
        body = [
            "## Codec (msgpack + zstd)",
            "",
            f"`python benchmarks/bench_codec.py --write-docs` — {datetime.date.today()}, "
            f"{machine}; corpus: {corpus.vocab_size:,}-token byte-level BPE trained on "
            f"{corpus.source_bytes / 1e6:.1f} MB of stdlib sources. "
            "MB/s are of the logical payload "
            "(int32 token ids, int64 weight versions, float32 log-probs, bool mask: what "
            "`dockyard.producers.rollout_assembly` builds from every engine's output, and the "
            "bytes raw zstd compresses in the first baseline, already concatenated). The codec's "
            f"default level is {ZSTD_LEVEL}. "
            f"Zero-copy decode of arrays: {'yes' if copy_free else 'no'}.",
            "",
            *table,
            "",
            "Array transforms on the 64 × 8192 group's response token ids and log-probs "
            "(compress + decompress + undo the transform; ratio × MB/s is the figure of merit):",
            "",
            *ttable,
            "",
            "Reading it: the codec meets the raw-zstd floor by not entropy-coding what does "
            "not shrink. Float32 log-probs compress by ≈ 8% at level 1 for about half of "
            "zstd's time (the transform table: storing them has by far the best ratio × "
            "speed), so the encoder puts them last and the frame ends in zstd raw blocks "
            "(still one standard frame; `frames.compress_with_stored_tail`); token ids and "
            "weight versions are narrowed (uint16/uint8: better ratio *and* speed, zero-copy) "
            "and compressed. The overall ratio still beats raw zstd on the producer's dtypes. "
            "Since schema 3.0 a group travels field by field (lists of G values, and one "
            "array per field for all samples): decoding validates a few lists and arrays per "
            "group, not a model per sample, which took encode+decode of the 16 × 2048 group "
            "from 1.07× to ≈ 1.5× raw zstd (and halves the codec's cost on small groups, see "
            "the data plane). The messages are msgspec Structs: msgspec packs the metadata and "
            "decodes it straight into them (the arrays as views of the frame), a few percent "
            "here, where arrays dominate; the per-message cost of small groups is compared "
            "with the previous commit in its own section below. Byte-shuffle "
            "and delta coding are not kept (they lose on ratio × speed or need a copy on "
            "decode); level 1 is the default because level 3 buys ≈ 1-3% ratio for a large "
            "throughput loss.",
        ]
        write_docs(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
