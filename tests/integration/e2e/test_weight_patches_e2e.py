"""A run whose weight versions travel as sparse patches over the real broker."""

from __future__ import annotations

import json

import pytest

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps

pytestmark = pytest.mark.slow

STEPS = 5
SNAPSHOT_EVERY = 3


def _events(log_file) -> list[dict]:
    return [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]


def test_a_run_with_patches_refits_every_version_from_snapshots_and_patches(tmp_path, small_run):
    run_dir = tmp_path / "run"
    overrides = [
        *small_run,
        f"grpo.max_num_steps={STEPS}",
        # bf16 weights at an RL learning rate: most elements do not change from step to step.
        "policy.precision=bfloat16",
        "policy.optimizer.lr=1e-6",
        "data_plane.weight_transport.patches.enabled=true",
        f"data_plane.weight_transport.patches.snapshot_every={SNAPSHOT_EVERY}",
    ]
    result = run_dockyard("run", "--config", str(QUICKSTART), *overrides, "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_steps(run_dir) == list(range(1, STEPS + 1))
    assert_exactly_once(run_dir)

    # Versions 0 (the start) .. STEPS: a snapshot every SNAPSHOT_EVERY, patches in between.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "weights/blob_bytes" in r["metrics"]]
    patched = [r["step"] for r in steps if "weights/patch_changed_fraction" in r["metrics"]]
    assert patched == [s for s in range(1, STEPS + 1) if s % SNAPSHOT_EVERY != 0]

    worker_logs = sorted((run_dir / "logs").glob("rollout*.log"))
    assert worker_logs, sorted(p.name for p in (run_dir / "logs").iterdir())
    for log_file in worker_logs:
        events = _events(log_file)
        assert not [e for e in events if e["event"] in ("refit.refused", "refit.failed")]
        refits = {e["version"]: e["format"] for e in events if e["event"] == "refit.done"}
        # Each refit verified the digest of the patched weights (or it would be refused).
        assert "dockyard-sparse-patch" in refits.values()
        assert refits.get(0) == "safetensors"
