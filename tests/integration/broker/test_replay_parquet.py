"""``dockyard replay export --format parquet`` against a real nats-server: every value of every
row equals the codec's decode of the stored message, read back by pyarrow and by DuckDB, and
every message left out is reported (stderr, side file, exit status)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from broker_test_utils import collect

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import StoredMessage
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import (
    EngineInfo,
    Rollout,
    RolloutSample,
    SampleScore,
    SampleTimings,
    SamplingParams,
    ScoredRollout,
    decode,
    encode,
)
from tests.integration.roles.factories import prompt_group


def _sample(index: int, prompt: np.ndarray, length: int, **overrides: Any) -> RolloutSample:
    rng = np.random.default_rng(1000 + index * 7 + length)
    fields: dict[str, Any] = {
        "sample_index": index,
        "prompt_token_ids": prompt,
        "response_token_ids": rng.integers(0, 150_000, length, dtype=np.int64),
        "behaviour_logprobs": -rng.exponential(0.7, length).astype(np.float32),
        # A refit landed mid-generation: the later tokens come from a newer version.
        "token_weight_versions": np.array(
            [3] * (length // 2) + [4] * (length - length // 2), dtype=np.int64
        ),
        "loss_mask": (rng.integers(0, 2, length) if length else np.zeros(0)).astype(np.uint8),
        "finish_reason": "length" if index % 2 else "stop",
        "sampling": SamplingParams(temperature=0.9, max_new_tokens=64),
        "engine": EngineInfo(name="vllm", version="0.11.0"),
        "worker_id": f"worker-{index}",
        "timings": SampleTimings(started_at_unix_s=1.7e9 + index, finished_at_unix_s=1.7e9 + 9.5),
    }
    fields.update(overrides)
    return RolloutSample(**fields)


def _scored(group_id: str, lengths: list[int], *, shared: bool, **overrides: Any) -> ScoredRollout:
    group = prompt_group(group_id, generations=len(lengths))
    base = group.prompt_token_ids
    # Shared: every sample has the group's prompt (one on the wire); else each its own.
    prompts = [
        base if shared else np.concatenate([base, np.full(i, 7 + i, dtype=base.dtype)])
        for i in range(len(lengths))
    ]
    samples = [_sample(i, prompts[i], n, **overrides) for i, n in enumerate(lengths)]
    scores = [
        SampleScore(
            sample_index=i,
            reward=[1.0, -0.25, 0.5][i % 3],
            reward_components={"correct": float(i % 2), "format": 0.125} if i else {},
            invalid_action=i == 2,
            timed_out=i == 1,
            flags=["timed_out"] if i == 1 else [],
            detail="slow" if i == 1 else "",
            # Teacher log-probs for some samples only: the others' are null.
            teacher_logprobs=np.full(n, -0.5, dtype=np.float32) if i == 0 else None,
        )
        for i, n in enumerate(lengths)
    ]
    return ScoredRollout(
        rollout=Rollout(group=group, samples=samples, created_at_unix_s=1.7e9),
        scores=scores,
        scorer_id="scorer-3",
        scored_at_unix_s=1.7e9 + 12.0,
    )


GOOD = [
    _scored("g-shared", [5, 0, 9], shared=True),
    _scored("g-own-prompts", [4, 6, 2, 1], shared=False),
]
# float64 log-probs that float32 would round: kept out, not narrowed silently.
ROUNDED = _scored("g-rounded", [3, 3], shared=True, behaviour_logprobs=np.full(3, -0.1))


def _publish(config: DataPlaneConfig) -> list[StoredMessage]:
    async def run() -> list[StoredMessage]:
        async with JetStreamPlane(config) as plane:
            typed = MessagePlane(plane, stage="test")
            await typed.publish(GOOD[0])
            await plane.publish(plane.names.scored, b"not a zstd frame", msg_id="junk")
            await typed.publish(ROUNDED)
            # A rollout on the scored subject: it decodes, but has no scores.
            raw = encode(GOOD[1].rollout)
            await plane.publish(
                plane.names.scored, raw.payload, msg_id="stray-rollout", headers=raw.headers
            )
            await typed.publish(GOOD[1])
            return await collect(plane, plane.names.scored)

    return asyncio.run(run())


def _expected_rows(stored: list[StoredMessage]) -> list[dict[str, Any]]:
    """The rows the export must hold, from the codec's decode of the stored bytes and the
    messages' row views (not the export's columns)."""
    rows = []
    for message in stored:
        try:
            scored = decode(message.headers, message.data, expected=ScoredRollout)
        except Exception:
            continue
        if scored.group_id == "g-rounded":
            continue
        group = scored.rollout.group
        for sample, score in zip(scored.rollout.samples, scored.scores, strict=True):
            teacher = score.teacher_logprobs
            rows.append(
                {
                    "stream": message.stream,
                    "seq": message.seq,
                    "subject": message.subject,
                    "stored_at": message.timestamp,
                    "group_id": group.group_id,
                    "attempt": group.attempt,
                    "environment": group.environment,
                    "agent": group.agent,
                    "dataset": group.dataset_position.dataset,
                    "dataset_epoch": group.dataset_position.epoch,
                    "dataset_index": group.dataset_position.index,
                    "dispatch_weight_version": group.dispatch_weight_version,
                    "trace_id": group.trace_id,
                    "num_generations": group.num_generations,
                    "sample_index": sample.sample_index,
                    "prompt_token_ids": sample.prompt_token_ids.tolist(),
                    "response_token_ids": sample.response_token_ids.tolist(),
                    "behaviour_logprobs": sample.behaviour_logprobs.tolist(),
                    "token_weight_versions": sample.token_weight_versions.tolist(),
                    "loss_mask": [bool(x) for x in sample.loss_mask],
                    "finish_reason": str(sample.finish_reason),
                    "worker_id": sample.worker_id,
                    "engine": sample.engine.name,
                    "engine_version": sample.engine.version,
                    "generation_started_at_unix_s": sample.timings.started_at_unix_s,
                    "generation_finished_at_unix_s": sample.timings.finished_at_unix_s,
                    "reward": score.reward,
                    "reward_components": dict(score.reward_components),
                    "invalid_action": score.invalid_action,
                    "timed_out": score.timed_out,
                    "flags": list(score.flags),
                    "detail": score.detail,
                    "teacher_logprobs": None if teacher is None else teacher.tolist(),
                    "scorer_id": scored.scorer_id,
                    "scored_at_unix_s": scored.scored_at_unix_s,
                }
            )
    return rows


def _pyarrow_rows(path: Path) -> list[dict[str, Any]]:
    rows = pq.read_table(path).to_pylist()
    for row in rows:  # pyarrow reads a map as a list of (key, value) pairs
        row["reward_components"] = dict(row["reward_components"])
    return rows


def _duckdb_rows(path: Path) -> list[dict[str, Any]]:
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    cursor = connection.execute(f"SELECT * FROM read_parquet('{path}') ORDER BY seq, sample_index")
    names = [column[0] for column in cursor.description]
    rows = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
    for row in rows:  # DuckDB reads a map as a dict already; float32 as Python floats
        row["reward_components"] = dict(row["reward_components"])
    return rows


def _same(actual: Any, expected: Any) -> bool:
    if isinstance(expected, float):
        return isinstance(actual, float) and (actual == expected or math.isnan(expected))
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_same(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


def test_parquet_export_is_the_decoded_groups_row_by_row(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    config = data_plane_config_factory(nats_server.url)
    stored = _publish(config)
    target = ["--url", nats_server.url, "--namespace", config.namespace]
    out = tmp_path / "scored.parquet"

    export = ["replay", "export", "--subject", "scored", "--format", "parquet"]
    status = main([*export, "--out", str(out), *target])

    expected = _expected_rows(stored)
    assert len(expected) == 3 + 4  # the two good groups' samples
    for reader in (_pyarrow_rows, _duckdb_rows):
        rows = reader(out)
        assert [(r["group_id"], r["sample_index"]) for r in rows] == [
            (e["group_id"], e["sample_index"]) for e in expected
        ]
        for row, want in zip(rows, expected, strict=True):
            assert set(row) == set(want), reader.__name__
            for name, value in want.items():
                assert _same(row[name], value), (reader.__name__, want["group_id"], name)

    # Three messages left out, each named with its reason: exit status 1, stderr, side file.
    assert status == 1
    captured = capsys.readouterr()
    assert "wrote 7 samples of 2 groups" in captured.out
    seqs = {message.data: message.seq for message in stored}
    junk_seq = seqs[b"not a zstd frame"]
    refused = [
        json.loads(line)
        for line in (tmp_path / "scored.parquet.refused.jsonl").read_text().splitlines()
    ]
    reasons = {record["seq"]: record["refused"]["reason"] for record in refused}
    assert reasons[junk_seq] not in ("not_scored_rollout", "not_representable")
    assert sorted(reasons.values()).count("not_scored_rollout") == 1
    assert sorted(reasons.values()).count("not_representable") == 1
    assert len(reasons) == 3
    for seq, reason in reasons.items():
        assert f"left out seq {seq}: {reason}" in captured.err
    assert "3 messages left out" in captured.err
