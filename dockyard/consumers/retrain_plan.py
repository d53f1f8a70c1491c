"""What ``dockyard replay retrain`` re-trains, read from a run directory alone.

A run directory holds everything but the experience itself: the config the trainer started with
(``hyperparams.json``), the ledger's trail (which groups formed which step, in batch order), the
checkpoints, and each step's metrics. The plan names the checkpoint to restore (the newest one
at or before the step the re-training starts from), the groups of every step to re-train, and
the original metrics to compare with; every way a run directory can fail to answer is refused
with a :class:`RetrainRefused` that says which file and why.

Overrides turn a reproduction into an experiment on frozen data. Only keys that change the
trainer's math on the recorded groups take effect here; a key that decides what data was made
or selected (datasets, the age limit, the group size) or where a run's files go cannot take
effect on stored experience and is refused with its key path, so the config never lies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dockyard.algorithms.grpo import MasterConfig, registered_names
from dockyard.checkpoints.directories import CheckpointInfo, CheckpointManager
from dockyard.config.errors import ConfigError
from dockyard.config.loader import load_config
from dockyard.consumers.trainer.ledger import read_trail
from dockyard.consumers.trainer.loop import LEDGER_FILE
from dockyard.consumers.trainer.trainer_checkpoint import OPTIMIZER_FILE, STATE_FILE
from dockyard.observability.metrics.jsonl_backend import HYPERPARAMS_FILE, METRICS_FILE

#: Keys an experiment may change: the optimizer, the schedule, the loss and what the trainer
#: computes from the recorded groups (advantages, reward shaping, micro-batching, precision).
TAKES_EFFECT = (
    "loss_fn.",
    "policy.optimizer.",
    "policy.scheduler.",
    "policy.max_grad_norm",
    "policy.precision",
    "policy.train_micro_batch_size",
    "policy.logprob_batch_size",
    "policy.skip_prev_logprobs",
    "policy.sequence_packing.",
    "policy.dynamic_batching.",
    "grpo.",
)
#: ``grpo`` keys that decided which groups were made and trained: the ledger fixed that.
DECIDED_BY_THE_RUN = (
    "grpo.num_prompts_per_step",
    "grpo.num_generations_per_prompt",
    "grpo.async_grpo.",
    "grpo.use_dynamic_sampling",
    "grpo.dynamic_sampling_max_gen_batches",
    "grpo.max_num_epochs",
    "grpo.seed",
    "grpo.val_",
    "grpo.max_val_samples",
    "grpo.max_rollout_turns",
    "grpo.structured_tool_use.",
)


class RetrainRefused(ValueError):
    """The run directory (or the request) cannot give a faithful re-training."""


@dataclass(frozen=True)
class RetrainPlan:
    run_dir: Path
    config: MasterConfig
    #: The config keys (dotted paths) that differ from the run's: empty for a reproduction.
    changed_keys: tuple[str, ...]
    checkpoint: CheckpointInfo
    #: The scored-stream sequence the checkpoint's trainer would replay from on resume: every
    #: group trained after the checkpoint was stored at or after it.
    replay_from_seq: int
    #: Step -> its groups, in the order the trainer stacked them, for every step re-trained.
    steps: dict[int, list[str]]
    #: Step -> the metrics the run logged for it (the last record of the step: after a resume,
    #: the live line's).
    original_metrics: dict[int, dict[str, float]]

    @property
    def is_experiment(self) -> bool:
        return bool(self.changed_keys)

    @property
    def first_step(self) -> int:
        return min(self.steps)

    @property
    def last_step(self) -> int:
        return max(self.steps)

    def needed_groups(self) -> set[str]:
        return {group for groups in self.steps.values() for group in groups}


def load_run_config(run_dir: Path, overrides: Sequence[str]) -> tuple[MasterConfig, MasterConfig]:
    """``(the run's config, the config with overrides)``, from the ``hyperparams.json`` the
    trainer wrote when the run started."""
    path = _one_file(run_dir, HYPERPARAMS_FILE)
    try:
        original = load_config(path, (), registered=registered_names())
        changed = (
            load_config(path, overrides, registered=registered_names()) if overrides else original
        )
    except ConfigError as error:
        raise RetrainRefused(str(error)) from None
    return original, changed


def changed_keys(original: MasterConfig, changed: MasterConfig) -> list[str]:
    before = _flatten(original.model_dump(mode="json"))
    after = _flatten(changed.model_dump(mode="json"))
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


def refuse_keys_without_effect(keys: Sequence[str]) -> None:
    ignored = [
        key
        for key in keys
        if not key.startswith(TAKES_EFFECT) or key.startswith(DECIDED_BY_THE_RUN)
    ]
    if ignored:
        raise RetrainRefused(
            f"override of {', '.join(ignored)}: retrain trains the groups the ledger recorded, "
            "from stored experience, so this key cannot take effect (it decides which data was "
            "made or selected, or where the run's files go); keys that do: "
            f"{', '.join(k.rstrip('.') for k in TAKES_EFFECT)} (but not "
            f"{', '.join(k.rstrip('._') for k in DECIDED_BY_THE_RUN)})"
        )


def ledger_steps(run_dir: Path) -> dict[int, list[str]]:
    """Step -> its groups in batch order, from the ledger's trail (``ledger.jsonl``): the
    trainer appends a step's groups in the order it stacked them, and a resume rewrites the
    trail from the checkpoint's ledger (which keeps that order) before training again."""
    path = run_dir / LEDGER_FILE
    if not path.is_file():
        raise RetrainRefused(f"{path}: no ledger trail; retrain needs the run's ledger.jsonl")
    steps: dict[int, list[str]] = {}
    for event in read_trail(path):
        if event.get("event") == "trained":
            steps.setdefault(int(event["step"]), []).append(str(event["group_id"]))  # type: ignore[call-overload]  # a ledger event's JSON value
    return steps


def original_step_metrics(path: Path) -> dict[int, dict[str, float]]:
    """Each training step's metrics from ``metrics.jsonl`` (the records a step logs carry
    ``train/grad_norm``; validation-only records do not). The last record of a step wins."""
    found: dict[int, dict[str, float]] = {}
    if not path.is_file():
        return found
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        metrics = record.get("metrics", {})
        if "train/grad_norm" in metrics:
            found[int(record["step"])] = metrics
    return found


def plan_retrain(
    run_dir: Path, from_step: int, to_step: int | None, overrides: Sequence[str]
) -> RetrainPlan:
    original, config = load_run_config(run_dir, overrides)
    keys = changed_keys(original, config)
    refuse_keys_without_effect(keys)
    steps = ledger_steps(run_dir)
    if not steps:
        raise RetrainRefused(f"{run_dir / LEDGER_FILE}: the ledger records no trained step")
    last = max(steps)
    to_step = last if to_step is None else to_step
    if from_step < 1 or to_step < from_step:
        raise RetrainRefused(f"--from-step {from_step} --to-step {to_step}: need 1 <= from <= to")
    if to_step > last:
        raise RetrainRefused(f"--to-step {to_step}: the ledger's last trained step is {last}")
    checkpoint = _checkpoint_before(config, run_dir, from_step)
    wanted = range(checkpoint.step + 1, to_step + 1)
    missing = [step for step in wanted if step not in steps]
    if missing:
        raise RetrainRefused(
            f"{run_dir / LEDGER_FILE}: no groups recorded for steps {missing}; the trail "
            "does not describe them (was it edited, or written by another run?)"
        )
    state = json.loads((checkpoint.path / STATE_FILE).read_text())
    metrics_path = config.logger.directory(run_dir) / METRICS_FILE
    return RetrainPlan(
        run_dir=run_dir,
        config=config,
        changed_keys=tuple(keys),
        checkpoint=checkpoint,
        replay_from_seq=int(state["replay_from_seq"]),
        steps={step: steps[step] for step in wanted},
        original_metrics=original_step_metrics(metrics_path),
    )


def _checkpoint_before(config: MasterConfig, run_dir: Path, from_step: int) -> CheckpointInfo:
    """The newest checkpoint holding the weights step ``from_step`` started from (or earlier
    ones: the steps in between are re-trained too)."""
    root = config.checkpointing.directory(run_dir)
    if not root.is_dir():
        raise RetrainRefused(f"{root}: no checkpoints; retrain restores one (checkpointing)")
    usable = [info for info in CheckpointManager(config.checkpointing, root).list()]
    before = [info for info in usable if info.step < from_step]
    if not before:
        kept = ", ".join(str(info.step) for info in usable) or "none"
        raise RetrainRefused(
            f"no checkpoint before step {from_step} in {root} (kept: {kept}); re-training "
            "starts from a checkpoint's weights, optimizer and random state"
        )
    chosen = before[-1]
    if not (chosen.path / OPTIMIZER_FILE).is_file():
        raise RetrainRefused(
            f"{chosen.path}: no optimizer state (checkpointing.save_optimizer was false); "
            "re-training from fresh optimizer moments would not be the run's steps"
        )
    return chosen


def metrics_equal(old: float, new: float) -> bool:
    """Bit for bit, NaN included (a NaN loss reproduced is a reproduction)."""
    if isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new):
        return True
    return old == new


def _flatten(tree: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _one_file(run_dir: Path, name: str) -> Path:
    """``name`` in the run directory, or in the one metrics sub-directory (``logger.log_dir``)."""
    if (run_dir / name).is_file():
        return run_dir / name
    found = sorted(run_dir.glob(f"*/{name}"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise RetrainRefused(
            f"{run_dir}: no {name} (the config the trainer wrote when the run started)"
        )
    raise RetrainRefused(f"{run_dir}: several {name} ({', '.join(map(str, found))})")
