"""``dockyard replay retrain`` over a real nats-server: the real TrainerLoop (quickstart's model
and config, sized down) trains from a stand-in for the rollout worker and scorer (see
tests/unit/trainer/test_trainer_accounting.py), checkpointing every two steps; then the CLI
re-trains recorded steps from the stored scored stream with no worker and no scorer.

The expected values are the run's own records, read here independently of the retrain code:
each step's metrics from its ``metrics.jsonl`` and the digest of each step's weights from the
weight-version events the trainer published on the broker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.cli import main
from dockyard.config.loader import load_config
from dockyard.schemas import WeightVersion, decode
from tests.unit.trainer.test_trainer_accounting import next_incarnation, trainer

CHECKPOINTED = (
    # The stand-in reports behaviour log-probs of -0.1 that no model gave: quickstart's icepop
    # truncation would mask importance weights that far from 1, and the model would never move.
    "loss_fn.truncated_importance_sampling_type=null",
    "loss_fn.truncated_importance_sampling_ratio=null",
    "loss_fn.truncated_importance_sampling_ratio_min=null",
    "checkpointing.enabled=true",
    "checkpointing.save_period=2",
    "checkpointing.keep_top_k=null",
)
#: What the retrain compares: the step's math; timing and pipeline counters describe the fleet.
NOT_MATH = ("timing/", "staleness/", "pipeline/", "weights/", "generation_timeline/")


def _target(config) -> list[str]:  # type: ignore[no-untyped-def]
    return ["--url", config.url, "--namespace", config.namespace]


def _step_records(path: Path) -> dict[int, list[dict]]:
    """Every record a training step logged (several for a step trained again after a crash)."""
    steps: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "train/grad_norm" in record["metrics"]:
            steps.setdefault(record["step"], []).append(record["metrics"])
    return steps


def _math(metrics: dict) -> dict:
    return {
        k: v for k, v in metrics.items() if not k.startswith(NOT_MATH) and k != "train/tokens_per_s"
    }


def _published_digests(config) -> dict[int, set[str]]:  # type: ignore[no-untyped-def]
    async def read() -> dict[int, set[str]]:
        digests: dict[int, set[str]] = {}
        async with JetStreamPlane(config, provision=False) as plane:
            async for stored in plane.replay(plane.names.weight_events):
                event = decode(stored.headers, stored.data, expected=WeightVersion)
                digests.setdefault(event.step, set()).add(event.digest)
        return digests

    return asyncio.run(read())


def _train(run_dir: Path, config, *overrides: str, crash_after: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """A run of the real trainer; ``crash_after``: the first incarnation dies right after that
    step (an exception out of its loop, after the step's metrics and weights went out, before
    the next checkpoint), and a second incarnation resumes from the last checkpoint."""

    async def scenario() -> None:
        async with trainer(run_dir, *overrides, data_plane=config, varied=True) as loop:
            if crash_after is None:
                await loop.run()
                return
            train_step = loop._train_step

            async def dying(groups, wait_s):  # type: ignore[no-untyped-def]
                await train_step(groups, wait_s)
                if loop.step == crash_after:
                    raise RuntimeError("killed")

            loop._train_step = dying  # type: ignore[method-assign]
            with pytest.raises(RuntimeError, match="killed"):
                await loop.run()
            await (await next_incarnation(loop, run_dir, *overrides)).run()

    asyncio.run(scenario())


def _assert_reproduced(run_dir: Path, out: Path, config, steps: range) -> None:  # type: ignore[no-untyped-def]
    original = _step_records(run_dir / "metrics.jsonl")
    again = _step_records(out / "metrics.jsonl")
    assert sorted(again) == list(steps)
    for step in steps:
        for record in original[step]:  # the crashed incarnation's record of a step too
            assert _math(again[step][0]) == _math(record), f"step {step}"
    report = json.loads((out / "retrain.json").read_text())
    published = _published_digests(config)
    for entry in report["steps"]:
        # Every event the run published for the step names these weights (a resumed trainer
        # publishes its checkpoint's weights again, under the checkpoint's step).
        assert published[entry["step"]] == {entry["digest"]}
    assert report["reproduced"] is True
    # Not vacuous: every step moved the weights.
    assert len({entry["digest"] for entry in report["steps"]}) == len(steps)
    assert all(again[step][0]["train/grad_norm"] > 0 for step in steps)


def test_retrain_reproduces_the_recorded_steps_bit_for_bit(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    _train(tmp_path, data_plane_config, "grpo.max_num_steps=6", *CHECKPOINTED)
    run_files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()

    args = ["replay", "retrain", "--run-dir", str(tmp_path), "--from-step", "4"]
    assert main([*args, *_target(data_plane_config)]) == 0
    out = tmp_path / "retrain" / "steps_3-6"  # the checkpoint before step 4 is step 2's
    assert "reproduced bit for bit" in capsys.readouterr().out
    _assert_reproduced(tmp_path, out, data_plane_config, range(3, 7))
    assert {p: p.read_bytes() for p in run_files} == run_files  # the run's files untouched


def test_retrain_reproduces_a_run_killed_and_resumed_mid_way(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    # Checkpoints at 2 and 4; the first incarnation dies after step 5, the second resumes from
    # step 4, trains step 5 again from the replayed stream, and goes on to step 7.
    _train(tmp_path, data_plane_config, "grpo.max_num_steps=7", *CHECKPOINTED, crash_after=5)
    assert len(_step_records(tmp_path / "metrics.jsonl")[5]) == 2  # trained twice
    capsys.readouterr()

    args = ["replay", "retrain", "--run-dir", str(tmp_path), "--from-step", "3"]
    assert main([*args, "--to-step", "7", *_target(data_plane_config)]) == 0
    _assert_reproduced(tmp_path, tmp_path / "retrain" / "steps_3-7", data_plane_config, range(3, 8))


def test_an_override_is_an_experiment_written_beside_the_run(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    _train(tmp_path, data_plane_config, "grpo.max_num_steps=4", *CHECKPOINTED)
    before = hashlib.sha256((tmp_path / "metrics.jsonl").read_bytes()).hexdigest()
    capsys.readouterr()

    # The quickstart's schedule starts with a linear warm-up over W steps, so step s (1-based)
    # of the experiment trains at lr · s / W of the overridden lr while s ≤ W, whatever decay
    # follows the warm-up (asserted below: both steps lie within it).
    args = ["replay", "retrain", "--run-dir", str(tmp_path), "--from-step", "3"]
    assert main([*args, *_target(data_plane_config), "policy.optimizer.lr=0.01"]) == 0
    printed = capsys.readouterr().out
    assert "policy.optimizer.lr changed" in printed
    out = tmp_path / "retrain" / "steps_3-4_experiment_1"
    new = _step_records(out / "metrics.jsonl")
    old = _step_records(tmp_path / "metrics.jsonl")
    assert sorted(new) == [3, 4]
    policy = load_config("configs/quickstart.yaml").policy
    warmup = policy.scheduler.warmup_steps
    assert warmup >= 4 or policy.scheduler.name == "constant"

    def rates(lr: float) -> list[float]:
        return [lr * min(1.0, s / warmup) if warmup else lr for s in (3, 4)]

    assert [new[s][0]["train/learning_rate"] for s in (3, 4)] == pytest.approx(rates(0.01))
    assert [old[s][0]["train/learning_rate"] for s in (3, 4)] == pytest.approx(
        rates(policy.optimizer.lr)
    )
    # Step 3 starts from the same weights (the same gradients); step 4 from weights that
    # lr=0.01 moved further.
    assert new[3][0]["train/grad_norm"] == old[3][0]["train/grad_norm"]
    assert new[4][0]["train/grad_norm"] != old[4][0]["train/grad_norm"]
    assert hashlib.sha256((tmp_path / "metrics.jsonl").read_bytes()).hexdigest() == before
    report = json.loads((out / "retrain.json").read_text())
    assert report["experiment"] is True and report["changed_keys"] == ["policy.optimizer.lr"]

    # A second experiment gets a directory of its own.
    assert main([*args, *_target(data_plane_config), "loss_fn.ratio_clip_max=0.1"]) == 0
    assert (tmp_path / "retrain" / "steps_3-4_experiment_2" / "metrics.jsonl").is_file()


def test_an_override_that_cannot_take_effect_on_stored_experience_is_refused(
    data_plane_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    _train(tmp_path, data_plane_config, "grpo.max_num_steps=3", *CHECKPOINTED)
    capsys.readouterr()
    args = ["replay", "retrain", "--run-dir", str(tmp_path), "--from-step", "3"]
    assert (
        main([*args, *_target(data_plane_config), "grpo.async_grpo.max_trajectory_age_steps=3"])
        == 2
    )
    error = capsys.readouterr().err
    assert "grpo.async_grpo.max_trajectory_age_steps" in error and "cannot take effect" in error
    assert not (tmp_path / "retrain").exists()


def test_retrain_refuses_when_the_needed_experience_aged_out(
    nats_server_factory, data_plane_config_factory, tmp_path: Path, capsys
):
    # The experience stream holds 6 messages: 2 groups a step for 6 steps are more than that.
    # A full experience stream refuses new messages (discard new) and the trainer trims the
    # history no checkpoint of its own needs any more (docs/replay.md, 'Retention'): the groups
    # of step 3, which a retrain from the older checkpoint needs, are gone either way.
    server = nats_server_factory()
    config = data_plane_config_factory(server.url, streams={"max_msgs": 6})
    _train(tmp_path, config, "grpo.max_num_steps=6", *CHECKPOINTED)
    capsys.readouterr()
    args = ["replay", "retrain", "--run-dir", str(tmp_path), "--from-step", "3"]
    assert main([*args, *_target(config)]) == 2
    error = capsys.readouterr().err
    assert "scored groups of steps 3" in error and "not in the experience stream any more" in error
    assert "aged out" in error or "deleted or purged" in error
    assert not list((tmp_path / "retrain").glob("*/metrics.jsonl"))
