"""``data.extra_train_dataloaders`` through the real ``dockyard run`` (sync GRPO, an embedded
nats-server, separate role processes): the dispatcher mixes the extra loader in by round robin,
every group is trained exactly once, and a resumed run continues each loader where it stopped."""

from __future__ import annotations

import pytest

from tests.integration.e2e.conftest import QUICKSTART, run_dockyard
from tests.integration.e2e.ledger_checks import assert_exactly_once, metric_steps, read_trail

SYNC_WITH_EXTRA = [
    "grpo.async_grpo.enabled=false",
    "loss_fn.use_importance_sampling_correction=false",
    "~loss_fn.truncated_importance_sampling_type",
    "~loss_fn.truncated_importance_sampling_ratio",
    "~loss_fn.truncated_importance_sampling_ratio_min",
    # A second arithmetic set, its own agent name: 20 records, so no epoch wraps in 4 steps.
    "data.extra_train_dataloaders=[{name: arithmetic, agent_name: second, "
    "params: {num_samples: 20, seed: 5}}]",
]


def loader_positions(run_dir) -> dict[int, list[int]]:
    """The dispatched positions of each loader, in dispatch order (ids <run>:l1:e0:i3 are the
    extra loader's, <run>:e0:i3 data.train's)."""
    positions: dict[int, list[int]] = {0: [], 1: []}
    for event in read_trail(run_dir / "ledger.jsonl"):
        if event["event"] != "dispatched":
            continue
        parts = event["group_id"].split(":")
        loader = int(parts[1][1:]) if parts[1].startswith("l") else 0
        positions[loader].append(int(parts[-1][1:]))
    return positions


@pytest.mark.slow
def test_a_sync_run_mixes_the_extra_loader_in_and_resumes_each_where_it_stopped(
    tmp_path, small_run
):
    run_dir = tmp_path / "run"
    args = ["run", "--config", str(QUICKSTART), *small_run, *SYNC_WITH_EXTRA]
    first = run_dockyard(*args, "grpo.max_num_steps=2", "--run-dir", str(run_dir), timeout=280)
    assert first.returncode == 0, first.stderr[-3000:]
    trained_before = set(assert_exactly_once(run_dir))
    assert len(trained_before) == 2 * 4
    # 4 prompts a step, round robin over 2 loaders: 2 each per step.
    assert {len(p) for p in loader_positions(run_dir).values()} == {4}
    second = run_dockyard(*args, "grpo.max_num_steps=4", "--run-dir", str(run_dir), timeout=280)
    assert second.returncode == 0, second.stderr[-3000:]
    assert metric_steps(run_dir)[-2:] == [3, 4]
    trained = assert_exactly_once(run_dir)
    assert trained_before < set(trained) and len(trained) == 4 * 4
    positions = loader_positions(run_dir)
    # Each loader went on from its saved position: positions 0..7 in order, none twice.
    assert positions == {0: list(range(8)), 1: list(range(8))}
