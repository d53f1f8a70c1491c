"""A run's generation timeline (issue #26): the trainer writes each step's raw intervals to
``generation_timeline.jsonl``, exactly as the workers reported them, and only a bounded summary to
``metrics.jsonl``. The real TrainerLoop on a real nats-server; the worker is the accounting
tests' stand-in, which stamps every sample with a worker id and times the test chose."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

from dockyard.schemas import PromptGroup
from tests.unit.trainer.test_trainer_accounting import settled, step_metrics, trainer

PREFIX = "timing/generation_timeline"


async def test_raw_timeline_in_its_own_file_and_a_summary_in_the_metrics(
    tmp_path, data_plane_config
):
    reported: dict[str, list[tuple[str, float, float]]] = {}
    clock = itertools.count()

    def stamps(group: PromptGroup) -> list[tuple[str, float, float]]:
        # Sample i of every group on worker "w<i>"; distinct, increasing times of whole seconds.
        rows = []
        for index in range(group.num_generations):
            started = 1_700_000_000.0 + next(clock)
            rows.append((f"w{index}", started, started + 1.0 + index))
        reported[group.group_id] = rows
        return rows

    async with trainer(
        tmp_path, "grpo.max_num_steps=3", data_plane=data_plane_config, stamps=stamps
    ) as loop:
        await loop.run()

    _, trained, _ = settled(tmp_path)
    expected: dict[int, dict[str, list[tuple[float, float]]]] = defaultdict(dict)
    for group_id, step in trained.items():
        for worker, started, finished in reported[group_id]:
            expected[step].setdefault(worker, []).append((started, finished))

    lines = (tmp_path / "generation_timeline.jsonl").read_text().splitlines()
    raw = [json.loads(line) for line in lines]
    assert [r["step"] for r in raw] == [1, 2, 3]
    for record in raw:
        got = {
            worker: sorted(zip(w["started_at_unix_s"], w["finished_at_unix_s"], strict=True))
            for worker, w in record["workers"].items()
        }
        assert got == {w: sorted(v) for w, v in expected[record["step"]].items()}

    metrics = step_metrics(tmp_path)
    assert len(metrics) == 3
    for step_values in metrics:
        assert not any(isinstance(v, list | dict) for v in step_values.values()), step_values
        assert PREFIX not in step_values
        # 2 prompts x 2 generations per step: two samples per worker; w0's take 1 s, w1's 2 s.
        assert step_values[f"{PREFIX}/w0/count"] == 2
        assert step_values[f"{PREFIX}/w1/count"] == 2
        assert step_values[f"{PREFIX}/w0/max"] == 1.0
        assert step_values[f"{PREFIX}/w1/p50"] == 2.0
        assert 0 < step_values[f"{PREFIX}/w1/busy_fraction"] <= 1
