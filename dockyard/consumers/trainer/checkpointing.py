"""How the trainer starts (fresh, or from its latest checkpoint) and what it saves.

Exactly-once training across restarts: the ledger (in every checkpoint) is the seen-set, so a
group already trained or dropped is skipped whichever way it comes back; scored messages are
acked as they are taken in, and the checkpoint records the first stream sequence whose group the
ledger does not cover yet, so a resumed trainer replays the scored subject from there before
going live: the steps lost in a crash are retrained from exactly the groups they used.
"""

from __future__ import annotations

from pathlib import Path

from dockyard.broker.typed import MessagePlane
from dockyard.config.master import MasterConfig
from dockyard.consumers.trainer.build import TrainerParts
from dockyard.consumers.trainer.intake import Intake
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.consumers.trainer.lineage import VersionLineage
from dockyard.consumers.trainer.progress import LEDGER_FILE, Progress
from dockyard.consumers.trainer.prompt_source import PromptSource
from dockyard.consumers.trainer.trainer_checkpoint import (
    TrainerState,
    read_checkpoint,
    write_checkpoint,
)
from dockyard.consumers.trainer.validation import Validation
from dockyard.consumers.trainer.weight_publisher import WeightPublisher
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class Checkpointing:
    def __init__(
        self,
        config: MasterConfig,
        parts: TrainerParts,
        progress: Progress,
        *,
        run_dir: Path,
        messages: MessagePlane,
        intake: Intake,
        prompt_source: PromptSource,
        publisher: WeightPublisher,
        validation: Validation,
    ) -> None:
        self.config = config
        self.parts = parts
        self.progress = progress
        self.run_dir = run_dir
        self.messages = messages
        self.intake = intake
        self.prompt_source = prompt_source
        self.publisher = publisher
        self.validation = validation
        #: The replay point of the newest checkpoint written or resumed from (0: none yet):
        #: the scored history before it is no resume's concern.
        self.saved_replay_from = 0

    @property
    def enabled(self) -> bool:
        return self.parts.checkpoints is not None

    def due(self) -> bool:
        """A periodic save at this step (``checkpointing.save_period``)."""
        return self.enabled and self.progress.step % self.config.checkpointing.save_period == 0

    async def start(self) -> int:
        """Start fresh or resume, and publish the first weights; the scored-stream sequence to
        replay from (0 = nothing to replay)."""
        checkpoints = self.parts.checkpoints
        latest = checkpoints.latest() if checkpoints else None
        event = await self.messages.current_weight_version()
        published = event.version if event is not None else -1
        progress = self.progress
        if latest is None:
            progress.ledger.rewrite_trail()  # a previous incarnation without a checkpoint is undone
            self.parts.metrics.log_hyperparams(self.config)
            await self.validation.warm_start()
            if self.config.grpo.val_at_start:
                await self.validation.run(0)
            progress.weight_version = published + 1
            progress.lineage = VersionLineage.starting_at(progress.weight_version)
            await self.publisher.publish()
            # Scored groups of a previous incarnation (if any) are accounted for, not lost.
            return 1 if published >= 0 else 0
        checkpoint = read_checkpoint(latest.path)
        self.parts.ranks.load(checkpoint.weights, checkpoint.training_state, latest.path)
        state = checkpoint.state
        progress.step = state.step
        progress.ledger = Ledger.restore(state.ledger, self.run_dir / LEDGER_FILE)
        self.prompt_source.load_state_dict(state.dispatcher)
        # Versions only go up: the checkpoint's weights become a new version for the fleet,
        # at the checkpoint's place in the lineage (ages stay what they were).
        progress.lineage = VersionLineage.from_dict(state.lineage)
        progress.weight_version = max(published, state.weight_version) + 1
        progress.lineage.resumed(state.weight_version, progress.weight_version)
        log.info("trainer.resumed", step=progress.step, checkpoint=str(latest.path))
        self.saved_replay_from = state.replay_from_seq
        await self.publisher.publish()
        return state.replay_from_seq

    def save(self, metrics: dict[str, float] | None = None) -> None:
        """Blocking (a thread of its own): nothing else changes the trainer while it is
        awaited."""
        parts, progress = self.parts, self.progress
        assert parts.checkpoints is not None
        state = TrainerState(
            step=progress.step,
            weight_version=progress.weight_version,
            dispatcher=self.prompt_source.state_dict(),
            # Everything from here on may be lost with the steps after this checkpoint.
            replay_from_seq=self.intake.replay_from(),
            ledger=progress.ledger.snapshot(),
            lineage=progress.lineage.to_dict(),
        )
        values = {k.replace("/", ":"): v for k, v in (metrics or {}).items()}
        latest = parts.checkpoints.latest()
        if latest is not None and latest.step == progress.step:
            # A second save of this step (the run's end after a periodic save): it keeps the
            # metrics the first recorded, which rank it for retention (``keep_top_k``).
            values = {**latest.metrics, **values}
        # Gathered from every rank first (collectives), written by this rank alone.
        model_state = parts.ranks.model_state()
        training_state = (
            parts.ranks.training_state() if self.config.checkpointing.save_optimizer else None
        )
        parts.checkpoints.save(
            progress.step,
            lambda directory: write_checkpoint(
                directory,
                parts.model,
                parts.tokenizer,
                state,
                model_state=model_state,
                training_state=training_state,
                model_format=self.config.checkpointing.model_save_format,
                adapter=parts.ranks.adapter_checkpoint(),
            ),
            values,
        )
        # Only now is the history before this point no resume's concern (``history_trim``).
        self.saved_replay_from = state.replay_from_seq
        progress.summary.steps = progress.step
