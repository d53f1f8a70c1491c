"""The trainer process: consume scored groups, train, publish weights, validate, checkpoint.

The loop only orchestrates; each concern is a room of its own, built with the loop:

- :mod:`.intake`: scored groups pulled or replayed, decoded, checked against the ledger and the
  age limit (staleness), held until a step takes them;
- :mod:`.dead_letter_watch`: groups whose messages were dead-lettered, dropped at once;
- :mod:`.history_trim`: a full experience stream's history no one needs any more, deleted;
- :mod:`.starvation`: no data for too long: warn, then end the run with a diagnosis;
- :mod:`.worker_trust`: before a step, groups of rollout workers that disagree with the
  trainer's log-probs are dead-lettered (``grpo.worker_trust``);
- :mod:`.step`: the step itself, the weight hand-off (:mod:`.weight_publisher`), the metrics;
- :mod:`.validation`: validation runs and the supervised warm start;
- :mod:`.checkpointing`: start fresh or resume (exactly-once training across restarts), save.

They share :class:`~.progress.Progress` (step, weight version, lineage, ledger). What takes
time to build (the policy, its trainer, the datasets) is :func:`~.build.build_parts`'s, run off
the event loop by :func:`open_trainer`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from torch.distributed.device_mesh import DeviceMesh

from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.base import WeightBlobStore
from dockyard.config.master import MasterConfig
from dockyard.consumers.trainer.build import TrainerParts, build_parts
from dockyard.consumers.trainer.checkpointing import Checkpointing
from dockyard.consumers.trainer.dead_letter_watch import DeadLetterWatch
from dockyard.consumers.trainer.evaluation import EpisodesFactory
from dockyard.consumers.trainer.history_trim import HistoryTrim
from dockyard.consumers.trainer.image_screen import ImageScreen
from dockyard.consumers.trainer.intake import Intake, Pending
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.consumers.trainer.plot import plot_run
from dockyard.consumers.trainer.progress import LEDGER_FILE, Progress, TrainerSummary
from dockyard.consumers.trainer.prompt_source import PromptSource
from dockyard.consumers.trainer.starvation import StarvationWatch, TrainerStarved
from dockyard.consumers.trainer.step import TrainStep
from dockyard.consumers.trainer.validation import Validation
from dockyard.consumers.trainer.weight_publisher import WeightPublisher
from dockyard.consumers.trainer.worker_trust import WorkerScreen
from dockyard.observability.metrics.jsonl_backend import METRICS_FILE
from dockyard.observability.status_files import FINISHED, StatusFile
from dockyard.utils.logging import get_logger

__all__ = ["LEDGER_FILE", "TrainerLoop", "TrainerStarved", "TrainerSummary", "open_trainer"]

log = get_logger(__name__)


async def open_trainer(
    config: MasterConfig,
    messages: MessagePlane,
    weights: WeightBlobStore,
    run_dir: Path,
    prompt_source: PromptSource,
    *,
    status: StatusFile | None = None,
    producer_id: str | None = None,
    mesh: DeviceMesh | None = None,
    episodes: EpisodesFactory | None = None,
    stopping: asyncio.Event | None = None,
) -> TrainerLoop:
    """The trainer, its parts built off the event loop (model loading takes seconds to minutes,
    and the loop may be shared with other roles: ``dockyard run`` with ``data_plane: null``).
    ``mesh``: this is rank 0 of several trainer ranks (the others run
    :func:`~dockyard.consumers.trainer.ranks.run_follower`)."""
    parts = await asyncio.to_thread(build_parts, config, run_dir, mesh=mesh, episodes=episodes)
    return TrainerLoop(
        config,
        messages,
        weights,
        run_dir,
        prompt_source,
        parts,
        status=status,
        producer_id=producer_id,
        stopping=stopping,
    )


class TrainerLoop:
    def __init__(
        self,
        config: MasterConfig,
        messages: MessagePlane,
        weights: WeightBlobStore,
        run_dir: Path,
        prompt_source: PromptSource,
        parts: TrainerParts,
        *,
        status: StatusFile | None = None,
        producer_id: str | None = None,
        stopping: asyncio.Event | None = None,
    ) -> None:
        """``stopping``: set to drain and end the run (:meth:`stop` sets it too)."""
        self.config = config
        self.messages = messages
        self.plane = messages.plane
        self.run_dir = run_dir
        self.prompt_source = prompt_source
        self.parts = parts
        self.status = status or StatusFile(None, "trainer", "0")
        self.stopping = stopping or asyncio.Event()
        self.progress = Progress(Ledger(trail=run_dir / LEDGER_FILE))
        self.intake = Intake(config, messages, self.progress)
        self.dead_letters = DeadLetterWatch(messages, self.progress, self.intake.awaited_groups)
        self.starvation = StarvationWatch(
            config.run,
            self.plane,
            self.status,
            waiting_for_data=lambda: self.progress.ledger.in_flight > len(self.intake.pending),
            drop_lost_groups=self.intake.drop_lost_groups,
        )
        trust = config.grpo.worker_trust
        self.worker_screen = (
            WorkerScreen(
                trust,
                parts.ranks.agreement_sums,
                parts.pad_token_id,
                self.plane,
                lambda: self.progress.ledger,  # replaced on resume: read when used
            )
            if trust.enabled
            else None
        )
        self.image_screen = (
            ImageScreen(
                parts.processor,
                config.policy.generation.max_image_pixels,
                self.plane,
                lambda: self.progress.ledger,  # replaced on resume: read when used
            )
            if parts.processor is not None
            else None
        )
        self.publisher = WeightPublisher(
            messages,
            weights,
            parts.ranks,
            self.progress,
            dtype=parts.publish_dtype,
            producer_id=producer_id or f"trainer-{uuid.uuid4().hex[:8]}",
        )
        self.validation = Validation(config, parts, self.progress.summary, self.status)
        self.stepper = TrainStep(
            config,
            parts,
            self.progress,
            messages=messages,
            prompt_source=prompt_source,
            publisher=self.publisher,
            validation=self.validation,
            worker_screen=self.worker_screen,
            status=self.status,
        )
        self.checkpointing = Checkpointing(
            config,
            parts,
            self.progress,
            run_dir=run_dir,
            messages=messages,
            intake=self.intake,
            prompt_source=prompt_source,
            publisher=self.publisher,
            validation=self.validation,
        )
        self.history_trim = HistoryTrim(self.plane, lambda: self.checkpointing.saved_replay_from)

    # What the commands and tests read of the trainer.
    @property
    def step(self) -> int:
        return self.progress.step

    @property
    def summary(self) -> TrainerSummary:
        return self.progress.summary

    @property
    def ledger(self) -> Ledger:
        return self.progress.ledger

    @property
    def pending(self) -> list[Pending]:
        return self.intake.pending

    def stop(self) -> None:
        self.stopping.set()

    async def run(self) -> TrainerSummary:
        parts = self.parts
        try:
            replay_from = await self.checkpointing.start()
            self.status.update(
                "running", step=self.progress.step, weight_version=self.progress.weight_version
            )
            if replay_from:
                await self.intake.replay(replay_from)
            await self._train_until_done()
        finally:
            parts.ranks.stop()  # the other ranks (if any) are done too
            if parts.gpu_monitor is not None:  # may wait out a reading: not on the event loop
                await asyncio.to_thread(parts.gpu_monitor.stop)
            parts.metrics.close()
        return self.summary

    async def _train_until_done(self) -> None:
        config, progress, intake = self.config, self.progress, self.intake
        per_step = config.grpo.num_prompts_per_step
        self.starvation.fed()  # the silence is counted from here
        waiting_since = time.monotonic()
        while progress.step < config.grpo.max_num_steps and not self.stopping.is_set():
            dispatched = await self.prompt_source.top_up(
                progress.ledger.in_flight, progress.weight_version
            )
            progress.ledger.record_dispatched(dispatched)
            received = await intake.pull()
            await self.dead_letters.check_if_due()
            await self.history_trim.check_if_due()
            if received:
                self.starvation.fed()
            elif self.prompt_source.exhausted and progress.ledger.in_flight <= len(intake.pending):
                # Everything still open is here, and less than a step's worth (or it would
                # have been trained): the data is used up.
                intake.drop_exhausted(per_step)
                log.warning("trainer.dataset_exhausted", step=progress.step)
                break
            else:
                await self.starvation.check()
            if self.image_screen is not None and len(intake.pending) >= per_step:
                intake.pending = await self.image_screen.screen(intake.pending)
            if self.worker_screen is not None and len(intake.pending) >= per_step:
                intake.pending = await self.worker_screen.screen(intake.pending)
            if len(intake.pending) >= per_step:
                await self._train_step(intake.pending[:per_step], time.monotonic() - waiting_since)
                intake.stepped(per_step)
                waiting_since = time.monotonic()
        await self._finish()

    async def _train_step(self, groups: Sequence[Pending], wait_s: float) -> None:
        metrics = await self.stepper.train(groups, wait_s)
        if self.checkpointing.due():
            await asyncio.to_thread(self.checkpointing.save, metrics)

    async def _finish(self) -> None:
        """The last validation and checkpoint, the ledger's account of what is left open, the
        progress plot."""
        config, progress = self.config, self.progress
        final: dict[str, float] = {}
        # Validated at this step already: the same weights give the same answers.
        if config.grpo.val_at_end and not self.validation.validated_at(progress.step):
            final = await self.validation.run(progress.step)
        if self.checkpointing.enabled:
            await asyncio.to_thread(self.checkpointing.save, final)
        reason = (
            "the trainer was stopped"
            if self.stopping.is_set()
            else f"the run reached grpo.max_num_steps={config.grpo.max_num_steps}"
        )
        left = progress.ledger.record_open_at_end(reason)
        if left:
            log.info("trainer.open_at_end", groups=len(left), reason=reason)
        log_dir = config.logger.directory(self.run_dir)
        if (log_dir / METRICS_FILE).exists():
            plot_run(log_dir / METRICS_FILE, log_dir / "progress.png")
        progress.summary.steps = progress.step
        self.status.update(FINISHED, step=progress.step)
