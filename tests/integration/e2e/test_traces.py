"""Traces across the role processes of a real ``dockyard run`` (issue #26): with
``run.tracing.exporter: file`` every process writes its spans, and a group the trainer trained
(the ledger says which) is one trace from the dispatcher's publish to the trainer's receipt,
through a rollout worker and a scorer, each span the child of the publish it came from."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard


@pytest.mark.slow
def test_a_trained_groups_path_is_one_trace_across_the_processes(tmp_path, small_run):
    run_dir, traces = tmp_path / "run", tmp_path / "traces"
    done = run_dockyard(
        "run", "--config", str(QUICKSTART), *small_run, "grpo.max_num_steps=2",
        "run.tracing.exporter=file", f"run.tracing.directory={traces}",
        "--run-dir", str(run_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    files = sorted(p.name for p in traces.iterdir())
    assert files == ["spans-rollout-w0.jsonl", "spans-scorer-s0.jsonl", "spans-trainer-0.jsonl"]
    spans = [
        json.loads(line) for path in traces.iterdir() for line in path.read_text().splitlines()
    ]
    by_group: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        group = span["attributes"].get("dockyard.group_id")
        if group is not None:
            by_group[group].append(span)
    ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    trained = [e["group_id"] for e in ledger if e["event"] == "trained"]
    assert trained
    for group in trained:
        named = {s["name"]: s for s in by_group[group]}
        service = {n: s["resource"]["attributes"]["service.name"] for n, s in named.items()}
        assert service == {
            "publish PromptGroup": "dockyard-trainer",  # the dispatcher lives in the trainer
            "receive PromptGroup": "dockyard-rollout",
            "publish Rollout": "dockyard-rollout",
            "receive Rollout": "dockyard-scorer",
            "publish ScoredRollout": "dockyard-scorer",
            "receive ScoredRollout": "dockyard-trainer",
        }, group
        assert len({s["context"]["trace_id"] for s in named.values()}) == 1, group
        span_id = {n: s["context"]["span_id"] for n, s in named.items()}
        assert named["publish PromptGroup"]["parent_id"] is None
        assert named["publish Rollout"]["parent_id"] == span_id["publish PromptGroup"]
        assert named["publish ScoredRollout"]["parent_id"] == span_id["publish Rollout"]
        assert named["receive ScoredRollout"]["parent_id"] == span_id["publish ScoredRollout"]
    assert len({by_group[g][0]["context"]["trace_id"] for g in trained}) == len(trained)
