"""The codec against a git revision of itself: encode and decode, side by side in one run.

    python benchmarks/bench_codec_baseline.py [--baseline HEAD~1] [--rounds 5] [--write-docs]

The baseline revision is checked out into a temporary git worktree; each round times both trees
in turn, each in a fresh interpreter whose ``PYTHONPATH`` is that tree, on the same ScoredRollout
groups (the data plane's 64 KiB group and a larger one). Times are CPU seconds of the process
(``time.process_time``), medians over many calls: on a shared machine they move less than wall
time. The table gives each tree's median over the rounds and the ratio baseline / current
(> 1: the current tree is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: (label, samples, response tokens): the data plane's 64 KiB group, and a larger one.
CASES = (("16 × 240 (≈ 64 KiB)", 16, 240), ("16 × 2048", 16, 2048))

#: Run inside each tree: prints {"<label> encode": seconds, "<label> decode": seconds}.
_MEASURE = """
import json, statistics, sys, time
import numpy as np
from corpus import load_corpus, make_scored_rollout
from dockyard.schemas import ScoredRollout, decode, encode

cases, seconds = json.loads(sys.argv[1]), float(sys.argv[2])
corpus = load_corpus()
out = {}
for label, samples, tokens in cases:
    group = make_scored_rollout(corpus, np.random.default_rng(7), samples, tokens)
    message = encode(group)
    assert decode(message.headers, message.payload) == group
    calls = {
        "encode": lambda: encode(group),
        "decode": lambda: decode(message.headers, message.payload, expected=ScoredRollout),
    }
    for name, call in calls.items():
        call()
        times = []
        deadline = time.process_time() + seconds
        while len(times) < 5 or time.process_time() < deadline:
            started = time.process_time()
            call()
            times.append(time.process_time() - started)
        out[f"{label} {name}"] = statistics.median(times)
print(json.dumps(out))
"""


def measure(tree: Path, seconds: float) -> dict[str, float]:
    # The benchmarks' own helpers (corpus) come from the current tree: the same groups for both.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tree), str(ROOT / "benchmarks")))}
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, json.dumps(CASES), str(seconds)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD~1", help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.5, help="per case and round")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--reading", default="", help="what the change measured, for the docs")
    args = parser.parse_args()
    revision = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        baseline = Path(scratch) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(baseline), revision],
            cwd=ROOT,
            check=True,
        )
        try:
            runs: dict[str, list[dict[str, float]]] = {"current": [], "baseline": []}
            for _ in range(args.rounds):
                runs["current"].append(measure(ROOT, args.seconds))
                runs["baseline"].append(measure(baseline, args.seconds))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, check=True
            )
    lines = [
        f"| ScoredRollout group | operation | baseline `{revision}` µs | current µs | "
        "baseline / current |",
        "|---|---|---:|---:|---:|",
    ]
    for key in runs["current"][0]:
        label, _, operation = key.rpartition(" ")
        old = statistics.median(run[key] for run in runs["baseline"])
        new = statistics.median(run[key] for run in runs["current"])
        lines.append(
            f"| {label} | {operation} | {old * 1e6:.0f} | {new * 1e6:.0f} | **{old / new:.2f}×** |"
        )
    print("\n".join(lines))
    if args.write_docs:
        from report import replace_section

        replace_section(
            "codec",
            [
                "### Against the previous commit",
                "",
                f"`python benchmarks/bench_codec_baseline.py --baseline {args.baseline} "
                f"--rounds {args.rounds} --write-docs` ({date.today()}): `encode` and `decode` "
                "of ScoredRollout groups in this tree and in a git worktree of the baseline, "
                f"alternating, {args.rounds} rounds; CPU time per call, medians.",
                "",
                *lines,
                *(["", f"Reading: {args.reading}"] if args.reading else []),
            ],
            subsection="### Against the previous commit",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
