"""One training step: the groups a step takes become a batch, every rank steps on its share
(the prev-logprob pass, the loss, the optimizer: :class:`~.ranks.TrainerRanks`), the ledger
records them, the new weights go to the fleet, and the step's numbers go to the metrics, the
log and the status file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence

import torch

from dockyard.broker.plane import DataPlaneError
from dockyard.broker.typed import MessagePlane
from dockyard.config.master import MasterConfig
from dockyard.consumers.trainer.batch import TrainingBatch, build_batch
from dockyard.consumers.trainer.build import TrainerParts
from dockyard.consumers.trainer.intake import Pending
from dockyard.consumers.trainer.policy_trainer import StepOutcome
from dockyard.consumers.trainer.progress import Progress
from dockyard.consumers.trainer.prompt_source import PromptSource
from dockyard.consumers.trainer.validation import Validation
from dockyard.consumers.trainer.weight_publisher import WeightPublisher
from dockyard.consumers.trainer.worker_trust import WorkerScreen
from dockyard.observability.prometheus import CONSUMER_BACKLOG, TRAIN_STEP_DURATION
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import ScoredRollout
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class TrainStep:
    def __init__(
        self,
        config: MasterConfig,
        parts: TrainerParts,
        progress: Progress,
        *,
        messages: MessagePlane,
        prompt_source: PromptSource,
        publisher: WeightPublisher,
        validation: Validation,
        worker_screen: WorkerScreen | None,
        status: StatusFile,
    ) -> None:
        self.config = config
        self.parts = parts
        self.progress = progress
        self.messages = messages
        self.prompt_source = prompt_source
        self.publisher = publisher
        self.validation = validation
        self.worker_screen = worker_screen
        self.status = status

    async def train(self, groups: Sequence[Pending], wait_s: float) -> dict[str, float]:
        """Step on ``groups``, publish the new weights, log; the step's metrics."""
        progress, parts = self.progress, self.parts
        scored = [p.scored for p in groups]
        batch = build_batch(scored, parts.pad_token_id)
        ages = torch.tensor(
            [
                progress.lineage.age(int(v), progress.weight_version)
                for v in batch.min_weight_versions
            ],
            dtype=torch.float32,
        )
        outcome = await asyncio.to_thread(parts.ranks.step, batch)
        TRAIN_STEP_DURATION.observe(outcome.seconds)
        progress.step += 1
        progress.ledger.record_trained([s.group_id for s in scored], progress.step)
        publish_started = time.perf_counter()
        progress.weight_version += 1
        await self.publisher.publish()
        publish_s = time.perf_counter() - publish_started
        await self._measure_backlogs()
        metrics = self._metrics(batch, outcome, ages, wait_s=wait_s, publish_s=publish_s)
        if self.config.grpo.val_period and progress.step % self.config.grpo.val_period == 0:
            metrics.update(await self.validation.run(progress.step, log_now=False))
        gpu_series = parts.gpu_monitor.take_due() if parts.gpu_monitor is not None else {}
        timeline = parts.metrics.log_generation_timeline(generation_timeline(scored), progress.step)
        parts.metrics.log_metrics({**metrics, **gpu_series, **timeline}, step=progress.step)
        self._report(metrics, outcome)
        return metrics

    def _metrics(
        self,
        batch: TrainingBatch,
        outcome: StepOutcome,
        ages: torch.Tensor,
        *,
        wait_s: float,
        publish_s: float,
    ) -> dict[str, float]:
        progress = self.progress
        summary = progress.summary
        return {
            **outcome.as_metrics(),
            "train/reward_mean": float(batch.rewards.mean()),
            "train/reward_std": float(batch.rewards.std()),
            "train/response_length_mean": float(batch.response_lengths.float().mean()),
            "train/tokens_per_s": batch.num_response_tokens / max(outcome.seconds, 1e-9),
            "staleness/mean": float(ages.mean()),
            "staleness/max": float(ages.max()),
            # The step's staleness histogram, as scalars every tracker takes (the dashboard
            # sums them over the run): samples trained at each age in weight versions.
            **{
                f"staleness/samples_at_age_{int(age)}": float(count)
                for age, count in zip(*torch.unique(ages, return_counts=True), strict=True)
            },
            "pipeline/dropped_stale": float(summary.dropped_stale),
            "pipeline/duplicates": float(summary.duplicates),
            "pipeline/in_flight": float(progress.ledger.in_flight),
            "pipeline/skipped_too_long": float(self.prompt_source.state.skipped_too_long),
            "timing/wait_for_data_s": wait_s,
            "timing/publish_weights_s": publish_s,
            "timing/scatter_batch_s": self.parts.ranks.last_scatter_s,
            "weights/version": float(progress.weight_version),
            **self.publisher.metrics(),
            **(self.worker_screen.trust.metrics() if self.worker_screen else {}),
        }

    def _report(self, metrics: dict[str, float], outcome: StepOutcome) -> None:
        step = self.progress.step
        log.info(
            "trainer.step",
            step=step,
            reward=round(metrics["train/reward_mean"], 4),
            val_accuracy=metrics.get("val/accuracy"),
            staleness=metrics["staleness/mean"],
            seconds=round(outcome.seconds, 3),
        )
        self.status.update(
            step=step,
            weight_version=self.progress.weight_version,
            reward=metrics["train/reward_mean"],
            val_accuracy=metrics.get(
                "val/accuracy", self.status.status.counters.get("val_accuracy", -1)
            ),
            staleness=metrics["staleness/mean"],
            tokens_per_s=metrics["train/tokens_per_s"],
        )

    async def _measure_backlogs(self) -> None:
        """Each stage's consumer backlog into the metrics, once a step (three cheap reads of
        consumer info; a scrape cannot ask the plane itself, it runs on another thread)."""
        names = self.messages.names
        for consumer in (names.prompt_consumer, names.rollout_consumer, names.scored_consumer):
            try:
                lag = await self.messages.plane.consumer_lag(consumer)
            except DataPlaneError as error:  # the broker away: the gauge keeps its last value
                log.warning("trainer.backlog_unread", consumer=consumer.durable, error=repr(error))
                continue
            CONSUMER_BACKLOG.labels(lag.durable).set(lag.backlog)


def generation_timeline(groups: Iterable[ScoredRollout]) -> dict[str, list[tuple[float, float]]]:
    """Per rollout worker, the (started, finished) Unix times of each sample trained this step,
    as the worker reported them (raw to ``generation_timeline.jsonl``, summarised in metrics)."""
    timeline: dict[str, list[tuple[float, float]]] = {}
    for group in groups:
        samples = group.rollout.samples
        # The timing columns are a Struct made from SampleTimings' fields at import time
        # (schemas/rollout.py): the type checker cannot see them.
        timings = samples.timings
        started_at: list[float] = timings.started_at_unix_s  # type: ignore[attr-defined]  # see above
        finished_at: list[float] = timings.finished_at_unix_s  # type: ignore[attr-defined]  # see above
        for worker, started, finished in zip(
            samples.worker_id, started_at, finished_at, strict=True
        ):
            timeline.setdefault(worker, []).append((started, finished))
    return timeline
