"""Scorer pool throughput for the math environment: groups/s with 1 and 2 scorer processes.

A real embedded nats-server; N rollout groups (8 samples each, answers in ``\\boxed{}`` and as a
last number, half of them correct, some symbolic: fractions, roots) are published while K
``dockyard score`` processes (started and ready first) share the durable consumer until every
group is scored. The time counts from the first publish to the last scored message; the
2-instance case is compared against 1 in the same run.

    python benchmarks/bench_scorer.py [--groups 200] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.models import load_tokenizer
from dockyard.observability.status_files import read_statuses
from dockyard.schemas import (
    DatasetPosition,
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleTimings,
    SamplingParams,
)

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny://qwen2-bpe"
PROBLEMS = [
    ("1/2", ["The answer is \\boxed{\\frac{1}{2}}", "so we get 0.5", "\\boxed{2}", "it is 1/3"]),
    ("sqrt(2)", ["\\boxed{\\sqrt{2}}", "\\boxed{2^{1/2}}", "\\boxed{1.41}", "no idea"]),
    ("42", ["The result is 42.", "\\boxed{42}", "\\boxed{41}", "6*7 = 42, final 43"]),
]


def make_rollout(index: int, tokenizer) -> Rollout:
    truth, answers = PROBLEMS[index % len(PROBLEMS)]
    prompt = np.array(tokenizer.encode(f"Problem {index}:"), dtype=np.int32)
    group = PromptGroup(
        group_id=f"bench-{index}",
        prompt_token_ids=prompt,
        prompt_text=f"Problem {index}:",
        environment="math",
        agent="bench",
        num_generations=8,
        dataset_position=DatasetPosition(dataset="bench", epoch=0, index=index),
        ground_truth=truth,
        dispatch_weight_version=0,
        trace_id=f"bench-{index}",
    )
    now = time.time()
    samples = []
    for sample_index in range(8):
        tokens = np.array(tokenizer.encode(answers[sample_index % 4]), dtype=np.int32)
        samples.append(
            RolloutSample(
                sample_index=sample_index,
                prompt_token_ids=prompt,
                response_token_ids=tokens,
                behaviour_logprobs=np.full(len(tokens), -1.0, dtype=np.float32),
                token_weight_versions=np.zeros(len(tokens), dtype=np.int64),
                loss_mask=np.ones(len(tokens), dtype=np.uint8),
                finish_reason="stop",
                sampling=SamplingParams(temperature=1.0, max_new_tokens=64),
                engine=EngineInfo(name="bench", version="0"),
                worker_id="bench",
                timings=SampleTimings(started_at_unix_s=now, finished_at_unix_s=now),
            )
        )
    return Rollout(group=group, samples=samples)


async def publish(url: str, namespace: str, groups: int) -> None:
    config = DataPlaneConfig(url=url, namespace=namespace, streams={"max_bytes": 256 << 20})
    tokenizer = load_tokenizer(MODEL)
    async with JetStreamPlane(config) as plane:
        messages = MessagePlane(plane, stage="bench")
        await messages.publish_many([make_rollout(i, tokenizer) for i in range(groups)])


async def scored_count(url: str, namespace: str) -> int:
    config = DataPlaneConfig(url=url, namespace=namespace, streams={"max_bytes": 256 << 20})
    async with JetStreamPlane(config) as plane:
        for stream in await plane.streams():
            if stream.name == plane.names.experience_stream.name:
                return stream.messages
    return 0


def run_case(url: str, instances: int, groups: int) -> float:
    """Seconds from the first publish to the last scored message, scorers already running."""
    namespace = f"bench{instances}x{int(time.time())}"
    overrides = [
        f"policy.model_name={MODEL}",
        f"data_plane.url={url}",
        f"data_plane.namespace={namespace}",
        "data_plane.streams.max_bytes=268435456",
    ]
    with tempfile.TemporaryDirectory() as status_dir:
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dockyard",
                    "--log-format",
                    "json",
                    "score",
                    "--config",
                    str(ROOT / "configs" / "quickstart.yaml"),
                    *overrides,
                    "--scorer-id",
                    f"s{i}",
                    "--status-dir",
                    status_dir,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=ROOT,
            )
            for i in range(instances)
        ]
        try:
            deadline = time.monotonic() + 120
            while sum(s.state == "running" for s in read_statuses(Path(status_dir))) < instances:
                if time.monotonic() > deadline:
                    raise TimeoutError("scorers did not start")
                time.sleep(0.1)
            started = time.perf_counter()
            asyncio.run(publish(url, namespace, groups))
            # Rollouts and scored rollouts share the experience stream: done at 2 × groups.
            while asyncio.run(scored_count(url, namespace)) < 2 * groups:
                if time.perf_counter() - started > 600:
                    raise TimeoutError("scorers did not finish in 10 minutes")
                time.sleep(0.1)
            return time.perf_counter() - started
        finally:
            for process in processes:
                process.terminate()
                process.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as store:
        server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=Path(store)))
        url = server.start()
        try:
            one = run_case(url, 1, args.groups)
            two = run_case(url, 2, args.groups)
        finally:
            server.stop()
    lines = [
        "### Scorer throughput (math environment)",
        "",
        f"`python benchmarks/bench_scorer.py --groups {args.groups} --write-docs` "
        f"({date.today()}): {args.groups} groups × 8 samples (boxed, numeric and symbolic "
        "answers) published while K `dockyard score` processes drain the shared durable "
        "consumer; time from the first publish (scorers already running) to the last scored "
        "message, so publishing overlaps scoring as in a pipeline. 2 cores.",
        "",
        "| scorer instances | seconds | groups/s | vs 1 instance |",
        "|---:|---:|---:|---:|",
        f"| 1 | {one:.1f} | {args.groups / one:.1f} | 1.00× |",
        f"| 2 | {two:.1f} | {args.groups / two:.1f} | {one / two:.2f}× |",
    ]
    print("\n".join(lines))
    if args.write_docs:
        replace_section("scorers", lines, subsection="### Scorer throughput (math environment)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
