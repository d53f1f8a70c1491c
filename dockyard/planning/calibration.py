"""Stage costs measured from a run directory, and what the run itself did.

A run writes, under its logger directory (the run directory by default):

- ``metrics.jsonl``: per step ``timing/train_step_s``, ``timing/publish_weights_s``,
  ``timing/wait_for_data_s``, ``weights/blob_bytes``, ``staleness/samples_at_age_<k>`` and the
  step's Unix ``time``;
- ``generation_timeline.jsonl``: per step and worker the (started, finished) Unix times of every
  sample trained — the samples of one generation batch share a start;
- ``logs/rollout-*.log``: ``refit.done`` events with their seconds;
- ``logs/scorer-*.log``: ``scorer.env_stats`` with the mean scoring latency per group.

Medians are taken (a shared machine's outliers are not the fleet's costs); the first step is
left out of the timings (it pays for warming up).
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dockyard.planning.fleet import FleetSpec, PipelineRules, StageCosts
from dockyard.planning.simulator import simulate

METRICS_FILE = "metrics.jsonl"
TIMELINE_FILE = "generation_timeline.jsonl"


class CalibrationError(ValueError):
    """A run directory without what calibration reads."""


@dataclass(frozen=True)
class MeasuredRun:
    """What a run did, in the simulator's terms (the steady state: end of step 1 to the end)."""

    steps: int
    steady_s: float
    steps_per_s: float
    trainer_idle_fraction: float
    staleness: dict[int, int]  # trained groups by age


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise CalibrationError(f"{path}: not found (is this a run directory?)")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        raise CalibrationError(f"{path}: not JSON lines ({error})") from None


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    steps = [r for r in _lines(run_dir / METRICS_FILE) if "timing/train_step_s" in r["metrics"]]
    if len(steps) < 2:
        raise CalibrationError(f"{run_dir / METRICS_FILE}: fewer than 2 training steps")
    return steps


def _log_events(run_dir: Path, pattern: str, event: str) -> list[dict[str, Any]]:
    found = []
    for path in sorted((run_dir / "logs").glob(pattern)):
        for line in path.read_text().splitlines():
            if f'"{event}"' not in line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a console-format line: not ours to read
            if record.get("event") == event:
                found.append(record)
    return found


def generation_batches(run_dir: Path, group_size: int) -> list[tuple[int, float]]:
    """(groups, seconds) of every generation batch after the first step's."""
    batches: dict[tuple[str, float], list[float]] = {}
    for record in _lines(run_dir / TIMELINE_FILE)[1:]:
        for worker, times in record["workers"].items():
            for started, finished in zip(
                times["started_at_unix_s"], times["finished_at_unix_s"], strict=True
            ):
                batches.setdefault((worker, started), []).append(finished)
    return [
        (max(1, round(len(ends) / group_size)), max(ends) - started)
        for (_, started), ends in batches.items()
    ]


def fit_generation(batches: list[tuple[int, float]]) -> tuple[float, float]:
    """(per batch, per group) seconds: least squares over the batches' sizes, or the mean per
    group when every batch had the same size (nothing to tell the two terms apart)."""
    if not batches:
        raise CalibrationError("no generation batches in the timeline")
    sizes = np.array([n for n, _ in batches], dtype=float)
    seconds = np.array([s for _, s in batches], dtype=float)
    if len(set(sizes)) > 1:
        design = np.stack([np.ones_like(sizes), sizes], axis=1)
        (per_batch, per_group), *_ = np.linalg.lstsq(design, seconds, rcond=None)
        if per_batch >= 0 and per_group > 0:
            return float(per_batch), float(per_group)
    return 0.0, float(np.median(seconds / sizes))


def _step_overheads(steps: list[dict[str, Any]]) -> list[float]:
    """Each step's period less its wait, training and publishing."""
    found = []
    for before, step in itertools.pairwise(steps):
        m = step["metrics"]
        spent = m["timing/wait_for_data_s"] + m["timing/train_step_s"]
        found.append(
            max(0.0, step["time"] - before["time"] - spent - m["timing/publish_weights_s"])
        )
    return found


def calibrate(
    run_dir: Path,
    *,
    rules: PipelineRules,
    workers: int,
    scorers: int,
    rollout_bytes: int,
    shared_cores: int | None = None,
) -> StageCosts:
    """The stage costs of the run in ``run_dir`` (made with ``rules``, ``workers`` rollout
    workers and ``scorers`` scorers; ``shared_cores``: its roles shared that many cores, which
    the fit of ``hop_s`` simulates)."""
    group_size = _group_size(run_dir)
    all_steps = _steps(run_dir)
    metrics = [s["metrics"] for s in all_steps[1:]]
    per_batch, per_group = fit_generation(generation_batches(run_dir, group_size))
    refits = [
        float(r["seconds"])
        for r in _log_events(run_dir, "rollout-*.log", "refit.done")
        if r.get("version", 0) > 0
    ]
    scoring = [
        float(r["mean_latency_s"])
        for r in _log_events(run_dir, "scorer-*.log", "scorer.env_stats")
        if r.get("groups")
    ]
    measured = StageCosts(
        gen_group_s=per_group,
        gen_batch_s=per_batch,
        train_step_s=statistics.median(m["timing/train_step_s"] for m in metrics),
        publish_s=statistics.median(m["timing/publish_weights_s"] for m in metrics),
        step_overhead_s=statistics.median(_step_overheads(all_steps)),
        hop_s=0.0,
        score_s=statistics.median(scoring) if scoring else 0.0,
        refit_s=statistics.median(refits) if refits else 0.0,
        weight_bytes=int(max(m.get("weights/blob_bytes", 0) for m in metrics)),
        rollout_bytes=rollout_bytes,
    )
    # Simulated for as many steps as the run made (it may have stopped before its limit).
    rules = replace(rules, steps=len(all_steps))
    spec = FleetSpec(
        rules, measured, workers=workers, scorers_per_site=scorers, shared_cores=shared_cores
    )
    target = measured_run(run_dir).steps_per_s
    return replace(measured, hop_s=fit_hop_s(spec, target))


def fit_hop_s(spec: FleetSpec, steps_per_s: float, *, tolerance_s: float = 1e-4) -> float:
    """The one cost no log records, the broker's time per pass on one machine: the value at
    which the simulated run's steps/s is the measured one (steps/s falls as it grows; 0 when
    the run was faster than the simulation with no broker time at all)."""

    def rate(hop_s: float) -> float:
        return simulate(replace(spec, costs=replace(spec.costs, hop_s=hop_s))).steps_per_s

    low, high = 0.0, 1.0
    if rate(low) <= steps_per_s:
        return 0.0
    while rate(high) > steps_per_s:  # a very slow broker: widen the bracket
        low, high = high, high * 2
    while high - low > tolerance_s:
        middle = (low + high) / 2
        low, high = (middle, high) if rate(middle) > steps_per_s else (low, middle)
    return (low + high) / 2


def _group_size(run_dir: Path) -> int:
    """Samples per group, from the run's own config (what its metrics count)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise CalibrationError(f"{path}: not found (is this a run directory?)")
    config = yaml.safe_load(path.read_text())
    try:
        return int(config["grpo"]["num_generations_per_prompt"])
    except (KeyError, TypeError, ValueError):
        raise CalibrationError(f"{path}: no grpo.num_generations_per_prompt") from None


def measured_run(run_dir: Path) -> MeasuredRun:
    group_size = _group_size(run_dir)
    steps = _steps(run_dir)
    steady_s = steps[-1]["time"] - steps[0]["time"]
    waits = sum(s["metrics"]["timing/wait_for_data_s"] for s in steps[1:])
    staleness: dict[int, int] = {}
    for step in steps:
        for key, samples in step["metrics"].items():
            if key.startswith("staleness/samples_at_age_"):
                age = int(key.rsplit("_", 1)[1])
                staleness[age] = staleness.get(age, 0) + round(samples / group_size)
    return MeasuredRun(
        steps=len(steps),
        steady_s=steady_s,
        steps_per_s=(len(steps) - 1) / steady_s,
        trainer_idle_fraction=waits / steady_s,
        staleness=dict(sorted(staleness.items())),
    )
