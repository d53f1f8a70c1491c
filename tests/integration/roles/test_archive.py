"""``dockyard archive`` over a real nats-server: a run of the real trainer (stand-in worker and
scorer, see test_trainer_accounting) is archived to Parquet partitioned by run and step; the
files are read back by pandas and DuckDB, the steps checked against the ledger the trainer
wrote, and the per-token arrays against the codec's decode of the stored messages."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.consumers.trainer.ledger import Ledger, read_trail
from dockyard.schemas import SampleScore, ScoredRollout, decode
from tests.integration.roles.factories import prompt_group, rollout
from tests.unit.trainer.test_trainer_accounting import trainer

LIST_COLUMNS = (
    "prompt_token_ids",
    "response_token_ids",
    "behaviour_logprobs",
    "token_weight_versions",
    "loss_mask",
)


def _target(config) -> list[str]:  # type: ignore[no-untyped-def]
    return ["--url", config.url, "--namespace", config.namespace]


def _stored_groups(config) -> dict[int, ScoredRollout]:  # type: ignore[no-untyped-def]
    """Every scored message on the broker, by sequence, as the codec decodes it."""

    async def read() -> dict[int, ScoredRollout]:
        async with JetStreamPlane(config, provision=False) as plane:
            return {
                stored.seq: decode(stored.headers, stored.data, expected=ScoredRollout)
                async for stored in plane.replay(plane.names.scored)
            }

    return asyncio.run(read())


def _expected_arrays(scored: ScoredRollout, index: int) -> dict[str, list]:
    sample = scored.rollout.samples[index]
    return {
        "prompt_token_ids": sample.prompt_token_ids.tolist(),
        "response_token_ids": sample.response_token_ids.tolist(),
        "behaviour_logprobs": sample.behaviour_logprobs.astype(np.float32).tolist(),
        "token_weight_versions": sample.token_weight_versions.tolist(),
        "loss_mask": [bool(x) for x in sample.loss_mask],
    }


def test_a_run_is_archived_by_run_and_step_and_reads_back_losslessly(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir, out = tmp_path / "run", tmp_path / "archive"

    # Workers one refit late and an age limit of 1: some groups are dropped as stale.
    async def scenario() -> None:
        async with trainer(
            run_dir,
            "grpo.max_num_steps=4",
            "grpo.async_grpo.max_trajectory_age_steps=1",
            versions_behind=1,
            data_plane=data_plane_config,
            varied=True,
        ) as loop:
            await loop.run()

    asyncio.run(scenario())
    events = read_trail(run_dir / "ledger.jsonl")
    trained = {e["group_id"]: e["step"] for e in events if e["event"] == "trained"}
    dropped = {e["group_id"] for e in events if e["event"] == "dropped"}
    assert dropped and len(trained) == 4 * 2
    capsys.readouterr()

    assert main(["archive", "--run-dir", str(run_dir), "--out", str(out), "--run", "exp1",
                 *_target(data_plane_config)]) == 0  # fmt: skip
    stored = _stored_groups(data_plane_config)

    frame = pd.read_parquet(out)  # Hive partitions: run and step come back as columns
    assert set(frame["run"].astype(str)) == {"exp1"}
    steps = {g: int(s) for g, s in zip(frame["group_id"], frame["step"].astype(int), strict=True)}
    for group_id, step in trained.items():
        assert steps[group_id] == step
    # Every other stored group was not trained: dropped, or left open when the run ended.
    for group_id in {s.group_id for s in stored.values()} - trained.keys():
        assert steps[group_id] == -1
    assert dropped <= {g for g, s in steps.items() if s == -1}
    assert len(frame) == sum(len(s.scores) for s in stored.values())

    connection = duckdb.connect()
    rows = connection.execute(
        f"SELECT seq, sample_index, step, {', '.join(LIST_COLUMNS)} FROM read_parquet("
        f"'{out}/**/*.parquet', hive_partitioning = true) ORDER BY seq, sample_index"
    ).fetchall()
    assert len(rows) == len(frame)
    for seq, index, step, *arrays in rows:
        expected = _expected_arrays(stored[seq], index)
        assert dict(zip(LIST_COLUMNS, arrays, strict=True)) == expected
        assert int(step) == trained.get(stored[seq].group_id, -1)

    # A second pass finds nothing new and rewrites nothing.
    files = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    capsys.readouterr()
    assert main(["archive", "--run-dir", str(run_dir), "--out", str(out), "--run", "exp1",
                 *_target(data_plane_config)]) == 0  # fmt: skip
    assert "archived 0 samples of 0 groups" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == files


def _scored(group_id: str, a: int) -> ScoredRollout:
    group = prompt_group(group_id, a, 1)
    return ScoredRollout(
        rollout=rollout(group, [str(a + 1), str(a)], version=2),
        scores=[SampleScore(sample_index=0, reward=1.0), SampleScore(sample_index=1, reward=0.0)],
        scorer_id="s-test",
    )


def test_the_archive_waits_for_the_ledger_at_the_first_unsettled_group(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # The ledger is the trainer's own (its trail file written by Ledger), settled by hand.
    run_dir, out = tmp_path / "run", tmp_path / "archive"
    run_dir.mkdir()
    ledger = Ledger(trail=run_dir / "ledger.jsonl")
    ledger.record_dispatched(["g1", "g2", "g3"])
    ledger.record_trained(["g1"], 1)
    ledger.record_trained(["g3"], 2)  # g2 is still open: the trainer may train it yet

    async def publish() -> list[int]:
        async with JetStreamPlane(data_plane_config) as plane:
            messages = MessagePlane(plane, stage="test")
            return [(await messages.publish(_scored(g, 10 + i))).seq for i, g in enumerate(
                ["g1", "g2", "g3"])]  # fmt: skip

    seqs = asyncio.run(publish())
    args = ["archive", "--run-dir", str(run_dir), "--out", str(out), *_target(data_plane_config)]
    assert main(args) == 0
    assert f"waiting at seq {seqs[1]}" in capsys.readouterr().out
    first = pd.read_parquet(out)
    assert list(first["group_id"].unique()) == ["g1"]
    assert set(first["step"].astype(int)) == {1}
    assert set(first["run"].astype(str)) == {"run"}  # the run directory's name

    ledger.record_dropped("g2", "stale: age 2 > 1")
    assert main(args) == 0
    final = pd.read_parquet(out)
    by_group = final.groupby("group_id")["step"].agg(lambda s: set(s.astype(int))).to_dict()
    assert by_group == {"g1": {1}, "g2": {-1}, "g3": {2}}
    assert len(final) == 3 * 2  # each group once, two samples each


def test_a_pass_over_more_steps_than_open_files_loses_no_row(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # One group per step for more steps than a pass keeps files open, then a group of step 1
    # again: step 1's file was closed meanwhile, so that group goes to a second file beside it.
    from dockyard.broker.parquet_export import MAX_OPEN_FILES

    run_dir, out = tmp_path / "run", tmp_path / "archive"
    run_dir.mkdir()
    count = MAX_OPEN_FILES + 2
    ids = [f"g{i}" for i in range(count + 1)]
    ledger = Ledger(trail=run_dir / "ledger.jsonl")
    ledger.record_dispatched(ids)
    for i, group_id in enumerate(ids[:count]):
        ledger.record_trained([group_id], i + 1)
    ledger.record_trained([ids[count]], 1)

    async def publish() -> None:
        async with JetStreamPlane(data_plane_config) as plane:
            messages = MessagePlane(plane, stage="test")
            for i, group_id in enumerate(ids):
                await messages.publish(_scored(group_id, 10 + i))

    asyncio.run(publish())
    args = ["archive", "--run-dir", str(run_dir), "--out", str(out)]
    assert main([*args, *_target(data_plane_config)]) == 0
    frame = pd.read_parquet(out)
    steps = frame.groupby("group_id")["step"].agg(lambda s: set(s.astype(int))).to_dict()
    assert steps == {**{g: {i + 1} for i, g in enumerate(ids[:count])}, ids[count]: {1}}
    assert len(frame) == len(ids) * 2
    assert sorted(p.name for p in (out / "run=run" / "step=1").iterdir()) == [
        "part-000000000001-2.parquet",
        "part-000000000001.parquet",
    ]


@pytest.mark.slow
def test_archive_follow_trails_the_ledger_until_stopped(data_plane_config, tmp_path: Path):
    # A real `dockyard archive --follow` process: its first pass waits at the unsettled g2; once
    # the ledger settles g2, a later pass archives g2 and g3; SIGTERM ends it cleanly.
    run_dir, out = tmp_path / "run", tmp_path / "archive"
    run_dir.mkdir()
    ledger = Ledger(trail=run_dir / "ledger.jsonl")
    ledger.record_dispatched(["g1", "g2", "g3"])
    ledger.record_trained(["g1", "g3"], 1)

    async def publish() -> None:
        async with JetStreamPlane(data_plane_config) as plane:
            messages = MessagePlane(plane, stage="test")
            for i, group_id in enumerate(["g1", "g2", "g3"]):
                await messages.publish(_scored(group_id, 10 + i))

    asyncio.run(publish())
    command = [sys.executable, "-m", "dockyard", "archive", "--run-dir", str(run_dir)]
    command += ["--out", str(out), "--follow", "--interval", "0.2", *_target(data_plane_config)]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment) as process:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "archived 2 samples of 1 groups" in first and "waiting at seq" in first
        ledger.record_dropped("g2", "stale: age 2 > 1")
        for line in process.stdout:  # passes find nothing new until they read the new trail
            if "of 2 groups" in line:
                break
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    steps = pd.read_parquet(out).groupby("group_id")["step"].agg(lambda s: set(s.astype(int)))
    assert steps.to_dict() == {"g1": {1}, "g2": {-1}, "g3": {1}}
