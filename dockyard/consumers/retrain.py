"""Recorded steps trained again from stored experience (``dockyard replay retrain``).

No rollout worker and no scorer: the scored groups each step used are read back from the
experience stream, from the position the restored checkpoint's trainer would replay from on a
resume, and stacked in the order the ledger recorded; the trainer's own pieces
(:class:`PolicyTrainer`, :func:`read_checkpoint`, :func:`build_batch`) do the rest, exactly as
the live loop calls them. So on the CPU with deterministic algorithms every re-trained step's
metrics equal the run's bit for bit and the weights hash to the digest the run published for
that step; a difference is a finding (a nondeterministic kernel, a changed dependency, a bug in
resume), not noise.

What is compared is what the step computed from its weights and groups (``loss/*``, ``train/*``
but the throughput): the run's timing, staleness and pipeline counters describe the live fleet,
which a re-training does not have. Validation is not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import DataPlane, StreamState
from dockyard.broker.weight_blobs.base import digest_of_bytes, tensors_to_bytes
from dockyard.consumers.retrain_plan import RetrainPlan, RetrainRefused, metrics_equal
from dockyard.consumers.trainer.batch import TrainingBatch, build_batch
from dockyard.consumers.trainer.policy_trainer import PolicyTrainer, StepOutcome
from dockyard.consumers.trainer.ranks import TrainerRanks
from dockyard.consumers.trainer.trainer_checkpoint import read_checkpoint
from dockyard.observability.metrics.jsonl_backend import JsonlBackend
from dockyard.schemas import CodecError, ScoredRollout, WeightVersion, decode
from dockyard.utils.logging import get_logger
from dockyard.utils.private_files import private_dir

log = get_logger(__name__)

REPORT_FILE = "retrain.json"
#: Metrics of a step that describe the live pipeline, not the step's math: never compared.
NOT_COMPARED_PREFIXES = ("timing/",)
NOT_COMPARED = frozenset({"train/tokens_per_s"})


@dataclass(frozen=True)
class StepResult:
    step: int
    metrics: dict[str, float]
    digest: str
    #: The run's metrics of this step, or None when metrics.jsonl has no record of it.
    original: dict[str, float] | None
    #: The digest of the weights the run published for this step, or None when its weight
    #: event is no longer stored.
    original_digest: str | None

    @property
    def differing(self) -> list[str]:
        if self.original is None:
            return []
        return [
            name
            for name, value in self.metrics.items()
            if name not in self.original or not metrics_equal(self.original[name], value)
        ]

    @property
    def digest_equal(self) -> bool | None:
        return None if self.original_digest is None else self.original_digest == self.digest

    def to_json(self) -> dict[str, object]:
        original = self.original or {}
        return {
            "step": self.step,
            "metrics": self.metrics,
            "original_metrics": {k: original.get(k) for k in self.metrics}
            if self.original
            else None,
            "differing": self.differing,
            "digest": self.digest,
            "original_digest": self.original_digest,
            "digest_equal": self.digest_equal,
        }


@dataclass
class RetrainReport:
    plan: RetrainPlan
    out_dir: Path
    steps: list[StepResult] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        """Every step's metrics and weights equal the run's, and each was compared."""
        return all(
            s.original is not None and not s.differing and s.digest_equal for s in self.steps
        )

    def to_json(self) -> dict[str, object]:
        plan = self.plan
        return {
            "run_dir": str(plan.run_dir),
            "checkpoint": str(plan.checkpoint.path),
            "checkpoint_step": plan.checkpoint.step,
            "first_step": plan.first_step,
            "last_step": plan.last_step,
            "experiment": plan.is_experiment,
            "changed_keys": list(plan.changed_keys),
            "reproduced": None if plan.is_experiment else self.reproduced,
            "steps": [s.to_json() for s in self.steps],
        }


# -- the experience --------------------------------------------------------------------------
#: Reads the experience stream's state (None when it is gone): the operator's survey of the
#: broker, which a role cannot reach itself, so the command that starts a retrain hands it in.
ExperienceState = Callable[[], Awaitable[StreamState | None]]


async def check_stored(
    plane: DataPlane, plan: RetrainPlan, experience_state: ExperienceState
) -> None:
    """Refuse, before anything is trained, when a group the plan trains is no longer in the
    experience stream (or no stored copy of it decodes), saying whether the stream's limits
    dropped it. Keeps only ids: the groups themselves are read again while training."""
    needed = plan.needed_groups()
    found: set[str] = set()
    unreadable: dict[str, str] = {}
    async for scored in _scored_copies(plane, plan, unreadable):
        if scored.group_id in needed:
            found.add(scored.group_id)
            if len(found) == len(needed):
                return
    raise RetrainRefused(
        _describe_missing(plan, needed - found, await experience_state(), unreadable)
    )


async def _scored_copies(
    plane: DataPlane, plan: RetrainPlan, unreadable: dict[str, str]
) -> AsyncIterator[ScoredRollout]:
    """The scored groups stored from the checkpoint's replay position on, decoded; the copies
    that do not decode are noted in ``unreadable`` (by message id) and passed over: a group
    counts as missing if no readable copy follows (chunks of an oversized message can age out
    on their own stream)."""
    async for stored in plane.replay(plane.names.scored, from_seq=plan.replay_from_seq):
        try:
            yield decode(stored.headers, stored.data, expected=ScoredRollout)
        except CodecError as error:
            unreadable[stored.msg_id or f"seq {stored.seq}"] = error.reason.value


async def published_digests(plane: DataPlane) -> dict[int, str]:
    """Step -> the digest of the weights the run published for it (the last event of a step:
    a resumed trainer publishes its checkpoint's weights again under the checkpoint's step)."""
    digests: dict[int, str] = {}
    async for stored in plane.replay(plane.names.weight_events):
        try:
            event = decode(stored.headers, stored.data, expected=WeightVersion)
        except CodecError:
            continue  # dead-lettered when published; no step of the run names it
        digests[event.step] = event.digest
    return digests


def _describe_missing(
    plan: RetrainPlan,
    missing: set[str],
    state: StreamState | None,
    unreadable: dict[str, str],
) -> str:
    steps = sorted({step for step, groups in plan.steps.items() if missing & set(groups)})
    head = (
        f"{len(missing)} scored groups of steps {_ranges(steps)} are not in the experience "
        f"stream any more (retrain from checkpoint step {plan.checkpoint.step} reads them from "
        f"sequence {plan.replay_from_seq} on)"
    )
    names = PlaneNames(plan.config.data_plane.namespace) if plan.config.data_plane else None
    if state is not None and state.first_seq > plan.replay_from_seq:
        oldest = state.first_time.isoformat(timespec="seconds") if state.first_time else "?"
        limits = plan.config.data_plane.streams if plan.config.data_plane else None
        configured = (
            f" (this run's data_plane.streams: max_age_s={limits.max_age_s:g}, "
            f"max_msgs={limits.max_msgs}, max_bytes={limits.max_bytes})"
            if limits is not None
            else ""
        )
        return (
            f"{head}: they aged out — stream {state.name} now begins at sequence "
            f"{state.first_seq} (its oldest message stored {oldest}); its limits{configured} "
            "dropped them. Re-train later steps (from a newer checkpoint), or keep the "
            "experience longer: docs/replay.md, 'Retention'"
        )
    detail = ""
    if unreadable:
        reasons = sorted(set(unreadable.values()))
        detail = f"; {len(unreadable)} stored copies could not be read ({', '.join(reasons)})"
    where = names.experience_stream.name if names else "the experience stream"
    return (
        f"{head}: {where} still begins before that position, so they were deleted or "
        f"purged, or never stored{detail}; first missing: {sorted(missing)[:3]}"
    )


def _ranges(steps: list[int]) -> str:
    if not steps:
        return "-"
    return f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0])


# -- training ----------------------------------------------------------------------------------
@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """``torch.use_deterministic_algorithms`` while re-training (an op without a deterministic
    implementation raises instead of differing silently); the previous setting afterwards."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def step_metrics(outcome: StepOutcome, batch: TrainingBatch) -> dict[str, float]:
    """The step's own numbers, by the formulas of ``TrainStep._metrics`` (trainer/step.py; so
    that the two compare): the loss and optimizer metrics and the batch's rewards and lengths."""
    metrics = {
        name: value
        for name, value in outcome.as_metrics().items()
        if not name.startswith(NOT_COMPARED_PREFIXES) and name not in NOT_COMPARED
    }
    metrics["train/reward_mean"] = float(batch.rewards.mean())
    metrics["train/reward_std"] = float(batch.rewards.std())
    metrics["train/response_length_mean"] = float(batch.response_lengths.float().mean())
    return metrics


def weights_digest(model: torch.nn.Module, precision: str) -> str:
    """The digest the trainer names a weight version by: its state in ``policy.precision`` on
    the CPU, as safetensors bytes (``WeightPublisher.publish`` in trainer/weight_publisher.py,
    and the blob store)."""
    from dockyard.models import precision_dtype

    dtype = precision_dtype(precision)
    state = {name: t.detach().to("cpu", dtype) for name, t in model.state_dict().items()}
    return digest_of_bytes(tensors_to_bytes(state))


class _Retraining:
    """The restored trainer and the output files; :meth:`train` one step at a time."""

    def __init__(self, plan: RetrainPlan, digests: dict[int, str], out_dir: Path) -> None:
        from dockyard.models import load_policy, load_processor

        self.plan, self.digests = plan, digests
        self.report = RetrainReport(plan, out_dir)
        config = plan.config
        # As the trainer builds itself (trainer/build.py, build_parts), then as it resumes.
        torch.manual_seed(config.grpo.seed)
        model, self.tokenizer = load_policy(
            config.policy.model_name, "float32", tokenizer_name=config.policy.tokenizer.name
        )
        processor = load_processor(config.policy.model_name)
        self.trainer = PolicyTrainer(model, config, processor=processor)
        # Loading the checkpoint keeps the config's optimizer and schedule settings
        # (PolicyTrainer.load_state_dict): an experiment's lr override takes effect.
        checkpoint = read_checkpoint(plan.checkpoint.path)
        TrainerRanks(self.trainer).load(
            checkpoint.weights, checkpoint.training_state, plan.checkpoint.path
        )
        state = checkpoint.state
        if state.step != plan.checkpoint.step:
            raise RetrainRefused(
                f"{plan.checkpoint.path}: holds step {state.step}, not {plan.checkpoint.step}"
            )
        self.writer = JsonlBackend(out_dir)
        self.writer.log_hyperparams(config.model_dump(mode="json"))

    def train(self, step: int, groups: list[ScoredRollout]) -> None:
        batch = build_batch(groups, self.tokenizer.pad_token_id)
        outcome = self.trainer.step(batch)
        result = StepResult(
            step=step,
            metrics=step_metrics(outcome, batch),
            digest=weights_digest(self.trainer.model, self.plan.config.policy.precision),
            original=self.plan.original_metrics.get(step),
            original_digest=self.digests.get(step),
        )
        self.writer.log_metrics({**result.metrics, "timing/train_step_s": outcome.seconds}, step)
        self.report.steps.append(result)
        log.info(
            "retrain.step",
            step=step,
            differing=len(result.differing),
            digest_equal=result.digest_equal,
        )

    def close(self) -> None:
        self.writer.close()
        path = self.report.out_dir / REPORT_FILE
        path.write_text(json.dumps(self.report.to_json(), indent=2))


async def retrain(
    plane: DataPlane, plan: RetrainPlan, out_dir: Path, experience_state: ExperienceState
) -> RetrainReport:
    """Check that the plan's groups are stored, restore its checkpoint and train its steps in
    order, each as soon as its groups have been read (so memory holds the groups read ahead of
    the step being trained, not the range's); every step's metrics go to
    ``out_dir/metrics.jsonl`` and the comparison to ``out_dir/retrain.json``."""
    await check_stored(plane, plan, experience_state)
    digests = await published_digests(plane)
    # Created once the check passed; its hyperparams.json is the run's config, credentials
    # included: its owner's only.
    private_dir(out_dir)
    steps = sorted(plan.steps)
    needed = plan.needed_groups()
    read: dict[str, ScoredRollout] = {}  # read, not trained yet
    taken: set[str] = set()  # the first copy of a group is the one the trainer used
    with deterministic_algorithms():
        retraining = await asyncio.to_thread(_Retraining, plan, digests, out_dir)
        try:
            async for scored in _scored_copies(plane, plan, {}):
                if scored.group_id not in needed or scored.group_id in taken:
                    continue
                taken.add(scored.group_id)
                read[scored.group_id] = scored
                while steps and all(g in read for g in plan.steps[steps[0]]):
                    step = steps.pop(0)
                    groups = [read.pop(g) for g in plan.steps[step]]
                    # Off the event loop: the broker connection stays served during a step.
                    await asyncio.to_thread(retraining.train, step, groups)
                if not steps:
                    break
        finally:
            retraining.close()
    if steps:  # deleted between the check and the training: say so, do not pass it over
        raise RetrainRefused(
            f"the groups of steps {_ranges(steps)} disappeared from the stream while "
            "re-training (its limits dropped them meanwhile?); the steps before were written"
        )
    return retraining.report
