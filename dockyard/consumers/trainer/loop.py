"""The trainer process: consume scored groups, train, publish weights, validate, checkpoint.

Exactly-once training:

- the ledger (in every checkpoint) is the seen-set: a group already trained or dropped is
  skipped, whichever way it comes back (redelivery, replay, a re-dispatch after a restart);
- scored messages are acked as they are taken in; the checkpoint records the first stream
  sequence whose group the ledger does not cover yet, and a resumed trainer replays the scored
  subject from there before going live — so the steps lost in a crash are retrained from
  exactly the groups they used, and nothing is skipped.

Staleness: a group whose oldest token came from weight version ``g`` is trained only while
the steps from ``g`` to the trainer's current version are at most
``max_trajectory_age_steps`` (async) or zero (sync), checked when it comes in and again after
every step; older groups are dropped, counted and written to the ledger. Steps are counted
along the lineage of versions (``lineage.py``), so a resume, which publishes the checkpoint's
weights under a new number, does not age the groups it left behind, and a group of a lost step
is judged at the step it is retrained at just as the crashed run judged it (the replay recomputes
the same steps, so the versions published after the checkpoint keep their places).
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh

from dockyard.algorithms.grpo import MasterConfig
from dockyard.algorithms.rewards import dynamic_sampling_filter
from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.plane import DataPlaneError
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.base import WeightBlobStore
from dockyard.broker.weight_blobs.chain import ChainPublisher, PublishedBlob
from dockyard.checkpoints.directories import CheckpointManager
from dockyard.consumers.trainer.backend import build_policy_trainer
from dockyard.consumers.trainer.batch import build_batch
from dockyard.consumers.trainer.evaluation import EpisodesFactory, Evaluator, log_val_samples
from dockyard.consumers.trainer.health import diagnose, fleet_readiness
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.consumers.trainer.lineage import VersionLineage
from dockyard.consumers.trainer.plot import plot_run
from dockyard.consumers.trainer.prompt_source import PromptSource
from dockyard.consumers.trainer.ranks import TrainerRanks, load_trained_policy
from dockyard.consumers.trainer.sft import run_sft
from dockyard.consumers.trainer.trainer_checkpoint import (
    TrainerState,
    read_checkpoint,
    write_checkpoint,
)
from dockyard.consumers.trainer.worker_trust import WorkerScreen
from dockyard.data.chat import build_prompt_dataset
from dockyard.environments.base import EnvironmentContext
from dockyard.environments.registry import build_environment
from dockyard.observability.metrics import MetricsLogger
from dockyard.observability.metrics.gpu_monitor import start_gpu_monitor
from dockyard.observability.metrics.jsonl_backend import METRICS_FILE
from dockyard.observability.prometheus import CONSUMER_BACKLOG, TRAIN_STEP_DURATION
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import (
    CodecError,
    PromptGroup,
    Rollout,
    ScoredRollout,
    WeightVersion,
    decode,
)
from dockyard.schemas.prompt import group_id_of
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

LEDGER_FILE = "ledger.jsonl"
#: How often the trainer looks for dead letters of the groups it waits for.
_DEAD_LETTER_CHECK_S = 2.0
#: The messages of a group, by schema name (their ids carry the group id).
_GROUP_MESSAGES = (PromptGroup.SCHEMA_NAME, Rollout.SCHEMA_NAME, ScoredRollout.SCHEMA_NAME)


class TrainerStarved(RuntimeError):
    """No scored data for ``run.starvation_timeout_s`` while the roles it waits for were ready,
    or for ``run.role_start_timeout_s`` while one was still starting: the run ends with the
    diagnosis."""


@dataclass(frozen=True)
class Pending:
    scored: ScoredRollout
    seq: int
    received_at: float


@dataclass
class TrainerSummary:
    steps: int
    weight_version: int
    val_accuracy_start: float | None = None
    val_accuracy_end: float | None = None
    dropped_stale: int = 0
    duplicates: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, val accuracy)


class TrainerLoop:
    def __init__(
        self,
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
    ) -> None:
        """``mesh``: this is rank 0 of several data-parallel trainer ranks (``torchrun``); the
        others run :func:`~dockyard.consumers.trainer.ranks.run_follower`. ``episodes``: with
        structured tool use, validation answers with episodes built by it."""
        self.episodes = episodes
        self.config = config
        self.mesh = mesh
        self.dispatcher = prompt_source
        self.messages = messages
        self.plane = messages.plane
        self.weights = weights
        patches = self.plane.config.weight_transport.patches
        self.weight_chain = ChainPublisher(
            weights, enabled=patches.enabled, snapshot_every=patches.snapshot_every
        )
        self.published_blob: PublishedBlob | None = None
        self.worker_screen: WorkerScreen | None = None  # grpo.worker_trust, set by _build
        self.run_dir = run_dir
        self.status = status or StatusFile(None, "trainer", "0")
        self.producer_id = producer_id or f"trainer-{uuid.uuid4().hex[:8]}"
        self.summary = TrainerSummary(steps=0, weight_version=-1)
        self.pending: list[Pending] = []
        self.step = 0
        self.weight_version = -1
        self.lineage = VersionLineage()
        self.last_seq = 0  # highest scored-stream sequence taken in
        self._dead_letters_seen = 0
        self._next_dead_letter_check = 0.0
        self.zero_variance_this_step = 0
        self.stopping = asyncio.Event()
        # Starvation: the clock runs from the later of the last data and the moment the last
        # awaited role reported itself ready; warned once per silence.
        self._fleet_ready_since = 0.0
        self._starvation_warned = False
        self._next_starting_log = 0.0

    def stop(self) -> None:
        self.stopping.set()

    # -- set-up ------------------------------------------------------------------------------
    def _build(self) -> None:
        from dockyard.models import precision_dtype

        cfg = self.config
        # Float32 master weights; policy.precision is the compute precision (autocast) and the
        # precision of published weights (dockyard.models.devices).
        self.model, self.tokenizer = load_trained_policy(cfg)
        # Sharded, a forward pass is a collective of every rank: validation generates on rank
        # 0 alone, with a whole copy refreshed from the gathered weights before each run.
        self.evaluation_model = copy.deepcopy(self.model) if self.mesh is not None else None
        # Moves the model to the training device (and shards it over the mesh); torch, or JAX
        # with policy.jax_cfg.enabled.
        self.trainer = build_policy_trainer(self.model, cfg, mesh=self.mesh)
        self.ranks = TrainerRanks(self.trainer)
        if self.evaluation_model is not None:
            self.evaluation_model.to(self.trainer.device)
        self.publish_dtype = precision_dtype(cfg.policy.precision)
        default_env = cfg.data.default_env
        self.train_data = build_prompt_dataset(
            cfg.data.train, cfg.data, cfg.policy.tokenizer, self.tokenizer
        )
        context = EnvironmentContext(env=cfg.env, distillation=cfg.on_policy_distillation)
        self.evaluator: Evaluator | None = None
        if cfg.data.validation is not None:
            validation = build_prompt_dataset(
                cfg.data.validation, cfg.data, cfg.policy.tokenizer, self.tokenizer
            )
            env_name = cfg.data.validation.env or default_env
            self.evaluator = Evaluator(
                self.evaluation_model or self.model,
                self.tokenizer,
                validation,
                build_environment(env_name, context),
                max_new_tokens=cfg.policy.generation.max_new_tokens,
                max_samples=cfg.grpo.max_val_samples,
                batch_size=cfg.grpo.val_batch_size,
                episodes=self.episodes,
            )
        self.checkpoints = (
            CheckpointManager(cfg.checkpointing, cfg.checkpointing.directory(self.run_dir))
            if cfg.checkpointing.enabled
            else None
        )
        self.metrics = MetricsLogger(cfg.logger, cfg.logger.directory(self.run_dir))
        self.gpu_monitor = start_gpu_monitor(cfg.logger)
        self.ledger = Ledger(trail=self.run_dir / LEDGER_FILE)
        trust = cfg.grpo.worker_trust
        self.worker_screen = (
            WorkerScreen(
                trust,
                lambda batch: self.trainer.batch_logprobs(self.trainer.model, batch),
                self.tokenizer.pad_token_id,  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in consumers)
                self.plane,
                lambda: self.ledger,
            )
            if trust.enabled
            else None
        )

    async def _resume_or_start(self) -> int:
        """Returns the scored-stream sequence to replay from (0 = nothing to replay)."""
        latest = self.checkpoints.latest() if self.checkpoints else None
        event = await self.messages.current_weight_version()
        published = event.version if event is not None else -1
        if latest is None:
            self.ledger.rewrite_trail()  # a previous incarnation without a checkpoint is undone
            self.metrics.log_hyperparams(self.config)
            await self._warm_start()
            if self.config.grpo.val_at_start:
                await self._validate(0)
            self.weight_version = published + 1
            self.lineage = VersionLineage.starting_at(self.weight_version)
            await self._publish_weights()
            # Scored groups of a previous incarnation (if any) are accounted for, not lost.
            return 1 if published >= 0 else 0
        checkpoint = read_checkpoint(latest.path)
        self.ranks.load(checkpoint.weights, checkpoint.training_state, latest.path)
        state = checkpoint.state
        self.step = state.step
        self.ledger = Ledger.restore(state.ledger, self.run_dir / LEDGER_FILE)
        self.dispatcher.load_state_dict(state.dispatcher)
        # Versions only go up: the checkpoint's weights become a new version for the fleet,
        # at the checkpoint's place in the lineage (ages stay what they were).
        self.lineage = VersionLineage.from_dict(state.lineage)
        self.weight_version = max(published, state.weight_version) + 1
        self.lineage.resumed(state.weight_version, self.weight_version)
        log.info("trainer.resumed", step=self.step, checkpoint=str(latest.path))
        await self._publish_weights()
        return state.replay_from_seq

    async def _warm_start(self) -> None:
        sft = self.config.sft
        if sft is None or not sft.enabled or sft.max_num_steps == 0:
            return
        if self.evaluator is None:
            raise ValueError("sft needs data.validation for its early-stop check")
        evaluator = self.evaluator
        if sft.dev_dataset is not None:
            dev = build_prompt_dataset(
                sft.dev_dataset, self.config.data, self.config.policy.tokenizer, self.tokenizer
            )
            evaluator = Evaluator(
                self.model,
                self.tokenizer,
                dev,
                self.evaluator.environment,
                max_new_tokens=self.config.policy.generation.max_new_tokens,
                episodes=self.episodes,
            )
        self.status.update("warm-start", detail="supervised warm start")
        result = await asyncio.to_thread(
            run_sft,
            self.model,
            self.tokenizer,
            self.train_data,
            sft,
            lambda: evaluator.evaluate_blocking().accuracy,
        )
        self.metrics.log_metrics(
            {
                "sft/steps": result.steps,
                "sft/val_accuracy": result.val_accuracy or 0.0,
                "timing/sft_s": result.seconds,
            },
            step=0,
        )
        log.info("sft.done", steps=result.steps, val_accuracy=result.val_accuracy)

    # -- the loop ----------------------------------------------------------------------------
    async def run(self) -> TrainerSummary:
        # Model loading takes seconds to minutes: off the event loop, which may be shared
        # with other roles (``dockyard run`` with ``data_plane: null``).
        await asyncio.to_thread(self._build)
        try:
            replay_from = await self._resume_or_start()
            self.status.update("running", step=self.step, weight_version=self.weight_version)
            if replay_from:
                await self._replay(replay_from)
            await self._train_until_done()
        finally:
            self.ranks.stop()  # the other ranks (if any) are done too
            if self.gpu_monitor is not None:  # may wait out a reading: not on the event loop
                await asyncio.to_thread(self.gpu_monitor.stop)
            self.metrics.close()
        return self.summary

    async def _train_until_done(self) -> None:
        cfg = self.config
        per_step = cfg.grpo.num_prompts_per_step
        last_data = time.monotonic()
        waiting_since = time.monotonic()
        while self.step < cfg.grpo.max_num_steps and not self.stopping.is_set():
            dispatched = await self.dispatcher.top_up(self.ledger.in_flight, self.weight_version)
            self.ledger.record_dispatched(dispatched)
            received = await self.messages.fetch(
                self.messages.names.scored_consumer,
                ScoredRollout,
                batch=cfg.data_plane.consumer.fetch_batch if cfg.data_plane else 16,
                timeout_s=0.5,
            )
            for item in received:
                self._take(item.message, item.delivery.seq)
                await item.ack()
            if time.monotonic() >= self._next_dead_letter_check:
                await self._drop_dead_lettered_groups()
            if received:
                last_data, self._starvation_warned = time.monotonic(), False
            elif self.dispatcher.exhausted and self.ledger.in_flight <= len(self.pending):
                # Everything still open is here, and less than a step's worth (or it would
                # have been trained): the data is used up.
                for pending in self.pending:
                    self.ledger.record_dropped(
                        pending.scored.group_id,
                        f"dataset exhausted: {len(self.pending)} groups left, "
                        f"fewer than a step's {per_step}",
                    )
                self.pending = []
                log.warning("trainer.dataset_exhausted", step=self.step)
                break
            else:
                await self._check_starvation(last_data)
            if self.worker_screen is not None and len(self.pending) >= per_step:
                self.pending = await self.worker_screen.screen(self.pending)
            if len(self.pending) >= per_step:
                wait_s = time.monotonic() - waiting_since
                await self._train_step(self.pending[:per_step], wait_s)
                self.pending = self.pending[per_step:]
                self._drop_stale_pending()  # the version moved on: the rest aged by one
                waiting_since = time.monotonic()
        validated_now = bool(self.summary.history) and self.summary.history[-1][0] == self.step
        final: dict[str, float] = {}
        if self.config.grpo.val_at_end and not validated_now:  # same weights: same answers
            final = await self._validate(self.step)
        if self.checkpoints is not None:
            await asyncio.to_thread(self._save_checkpoint, final)
        reason = (
            "the trainer was stopped"
            if self.stopping.is_set()
            else f"the run reached grpo.max_num_steps={self.config.grpo.max_num_steps}"
        )
        left = self.ledger.record_open_at_end(reason)
        if left:
            log.info("trainer.open_at_end", groups=len(left), reason=reason)
        log_dir = self.config.logger.directory(self.run_dir)
        if (log_dir / METRICS_FILE).exists():
            plot_run(log_dir / METRICS_FILE, log_dir / "progress.png")
        self.summary.steps = self.step
        self.status.update("finished", step=self.step)

    async def _check_starvation(self, last_data: float) -> None:
        """No scored data since ``last_data``: warn, then end the run with the diagnosis. A role
        still loading its engine is not starving the trainer, it is late: starvation time counts
        only while every role the trainer waits for reports itself ready (heartbeats), and a
        role that never gets ready ends the run after the separate, longer
        ``run.role_start_timeout_s``, named."""
        run = self.config.run
        now = time.monotonic()
        readiness = fleet_readiness(self.status.directory)
        if readiness.starting:
            self._fleet_ready_since = now
            waited = now - last_data
            if now >= self._next_starting_log:
                self._next_starting_log = now + run.starvation_warning_s
                log.info(
                    "trainer.waiting_for_roles",
                    starting=list(readiness.starting),
                    ready=list(readiness.ready),
                    waited_s=round(waited),
                )
                self.status.update(detail=f"waiting for {', '.join(readiness.starting)} to start")
            if waited > run.role_start_timeout_s:
                diagnosis = await diagnose(self.plane)
                raise TrainerStarved(
                    f"no scored data for {waited:.0f}s, roles still starting after "
                    f"run.role_start_timeout_s={run.role_start_timeout_s:g}; "
                    f"{readiness.describe()}; {diagnosis.describe()}"
                )
            return
        idle = now - max(last_data, self._fleet_ready_since)
        if idle > run.starvation_warning_s and not self._starvation_warned:
            diagnosis = await diagnose(self.plane)
            log.warning(
                "trainer.starving",
                idle_s=round(idle),
                detail=diagnosis.describe(),
                roles=readiness.describe(),
            )
            self.status.update(detail=diagnosis.describe())
            self._starvation_warned = True
            if diagnosis.nothing_in_flight and self.ledger.in_flight > len(self.pending):
                self._drop_lost_groups()
        if idle > run.starvation_timeout_s:
            diagnosis = await diagnose(self.plane)
            raise TrainerStarved(
                f"no scored data for {idle:.0f}s with the roles it waits for ready; "
                f"{readiness.describe()}; {diagnosis.describe()}"
            )

    def _take(self, scored: ScoredRollout, seq: int) -> None:
        self.last_seq = max(self.last_seq, seq)
        group_id = scored.group_id
        if self.ledger.seen(group_id) or any(p.scored.group_id == group_id for p in self.pending):
            self.summary.duplicates += 1
            return
        if self._dropped_as_stale(scored):
            return
        if self._drop_for_dynamic_sampling(scored):
            return
        self.pending.append(Pending(scored, seq, time.monotonic()))

    def _dropped_as_stale(self, scored: ScoredRollout) -> bool:
        """Drop (and record) a group whose oldest token is older than the age limit allows at
        the current version. Checked when a group comes in and again after every step, so no
        group is trained past the limit however long it waited."""
        oldest = scored.rollout.samples.min_weight_version()
        # The oldest token decides; steps are counted along the lineage (resumes included).
        age = self.lineage.age(oldest, self.weight_version) if oldest is not None else 0
        max_age = (
            self.config.grpo.async_grpo.max_trajectory_age_steps
            if self.config.grpo.async_grpo.enabled
            else 0
        )
        if age <= max_age:
            return False
        self.ledger.record_dropped(scored.group_id, f"stale: age {age} > {max_age}")
        self.summary.dropped_stale += 1
        return True

    def _drop_stale_pending(self) -> None:
        self.pending = [p for p in self.pending if not self._dropped_as_stale(p.scored)]

    def _drop_for_dynamic_sampling(self, scored: ScoredRollout) -> bool:
        """``grpo.use_dynamic_sampling`` (sync loop): a group whose rewards are all equal has no
        advantage; drop it and let the dispatcher send a replacement, at most
        ``dynamic_sampling_max_gen_batches`` batches' worth per step."""
        grpo = self.config.grpo
        if not grpo.use_dynamic_sampling:
            return False
        limit = grpo.dynamic_sampling_max_gen_batches * grpo.num_prompts_per_step
        if self.zero_variance_this_step >= limit:
            return False
        rewards = torch.tensor(scored.scores.reward)
        if dynamic_sampling_filter(rewards, [scored.group_id] * len(rewards)).num_groups_kept:
            return False
        self.zero_variance_this_step += 1
        self.ledger.record_dropped(scored.group_id, "dynamic sampling: zero reward variance")
        return True

    async def _drop_dead_lettered_groups(self) -> None:
        """A group one of whose messages was dead-lettered (its prompt, rollout or scored
        rollout) will never arrive: drop it with the dead letter's reason at once, so it does
        not hold the dispatcher's budget until the pipeline next runs dry."""
        self._next_dead_letter_check = time.monotonic() + _DEAD_LETTER_CHECK_S
        awaited = self._awaited_groups()
        async for stored in self.plane.replay(
            self.messages.names.dead_letters, from_seq=self._dead_letters_seen + 1
        ):
            self._dead_letters_seen = stored.seq
            try:
                letter = read_dead_letter(stored)
            except CodecError:
                continue
            group_id = group_id_of(letter.original_message_id or "", _GROUP_MESSAGES)
            if group_id in awaited:
                awaited.discard(group_id)
                self.ledger.record_dropped(
                    group_id, f"dead letter from {letter.stage}: {letter.reason}"
                )
                log.warning(
                    "trainer.dropped_dead_lettered", group_id=group_id, reason=letter.reason
                )

    def _awaited_groups(self) -> set[str]:
        """Groups dispatched and not settled that have not reached the trainer yet."""
        return self.ledger.open_groups() - {p.scored.group_id for p in self.pending}

    def _drop_lost_groups(self) -> None:
        """Groups dispatched but found nowhere in the pipeline (dead-lettered, or deduplicated
        away after a restart) would hold the dispatcher's budget forever: drop them, say so."""
        awaited = self._awaited_groups()
        lost = [g for g in self.ledger.dispatched if g in awaited]  # in dispatch order
        for group_id in lost:
            self.ledger.record_dropped(group_id, "lost: not found in any stage")
        log.warning("trainer.dropped_lost_groups", count=len(lost))

    async def _replay(self, from_seq: int) -> None:
        count = skipped = 0
        async for stored in self.plane.replay(self.messages.names.scored, from_seq=from_seq):
            try:
                scored = decode(
                    stored.headers, stored.data, limits=self.messages.limits, expected=ScoredRollout
                )
            except CodecError as error:
                # Refused when it first arrived (it is in the dead letters), or its chunks aged
                # out since: the dispatcher's lost-group check accounts for its group.
                skipped += 1
                log.warning("trainer.replay_skipped", seq=stored.seq, reason=error.reason.value)
                continue
            self._take(scored, stored.seq)
            count += 1
        log.info(
            "trainer.replayed",
            from_seq=from_seq,
            messages=count,
            skipped=skipped,
            pending=len(self.pending),
        )

    async def _train_step(self, groups: list[Pending], wait_s: float) -> None:
        cfg = self.config
        scored = [p.scored for p in groups]
        batch = build_batch(scored, self.tokenizer.pad_token_id)  # type: ignore[attr-defined]  # tokenizer: object here
        ages = torch.tensor(
            [self.lineage.age(int(v), self.weight_version) for v in batch.min_weight_versions],
            dtype=torch.float32,
        )
        outcome = await asyncio.to_thread(self.ranks.step, batch)
        TRAIN_STEP_DURATION.observe(outcome.seconds)
        self.step += 1
        self.zero_variance_this_step = 0
        self.ledger.record_trained([s.group_id for s in scored], self.step)
        publish_started = time.perf_counter()
        self.weight_version += 1
        await self._publish_weights()
        publish_s = time.perf_counter() - publish_started
        await self._measure_backlogs()
        tokens = batch.num_response_tokens
        metrics: dict[str, float] = {
            **outcome.as_metrics(),
            "train/reward_mean": float(batch.rewards.mean()),
            "train/reward_std": float(batch.rewards.std()),
            "train/response_length_mean": float(batch.response_lengths.float().mean()),
            "train/tokens_per_s": tokens / max(outcome.seconds, 1e-9),
            "staleness/mean": float(ages.mean()),
            "staleness/max": float(ages.max()),
            # The step's staleness histogram, as scalars every tracker takes (the dashboard
            # sums them over the run): samples trained at each age in weight versions.
            **{
                f"staleness/samples_at_age_{int(age)}": float(count)
                for age, count in zip(*torch.unique(ages, return_counts=True), strict=True)
            },
            "pipeline/dropped_stale": float(self.summary.dropped_stale),
            "pipeline/duplicates": float(self.summary.duplicates),
            "pipeline/in_flight": float(self.ledger.in_flight),
            "pipeline/skipped_too_long": float(self.dispatcher.state.skipped_too_long),
            "timing/wait_for_data_s": wait_s,
            "timing/publish_weights_s": publish_s,
            "timing/scatter_batch_s": self.ranks.last_scatter_s,
            "weights/version": float(self.weight_version),
            **weight_blob_metrics(self.published_blob),
            **(self.worker_screen.trust.metrics() if self.worker_screen else {}),
        }
        if cfg.grpo.val_period and self.step % cfg.grpo.val_period == 0:
            metrics.update(await self._validate(self.step, log_now=False))
        gpu_series = self.gpu_monitor.take_due() if self.gpu_monitor is not None else {}
        timeline = self.metrics.log_generation_timeline(generation_timeline(scored), self.step)
        self.metrics.log_metrics({**metrics, **gpu_series, **timeline}, step=self.step)
        log.info(
            "trainer.step",
            step=self.step,
            reward=round(metrics["train/reward_mean"], 4),
            val_accuracy=metrics.get("val/accuracy"),
            staleness=metrics["staleness/mean"],
            seconds=round(outcome.seconds, 3),
        )
        self.status.update(
            step=self.step,
            weight_version=self.weight_version,
            reward=metrics["train/reward_mean"],
            val_accuracy=metrics.get(
                "val/accuracy", self.status.status.counters.get("val_accuracy", -1)
            ),
            staleness=metrics["staleness/mean"],
            tokens_per_s=metrics["train/tokens_per_s"],
        )
        if self.checkpoints is not None and self.step % cfg.checkpointing.save_period == 0:
            await asyncio.to_thread(self._save_checkpoint, metrics)

    async def _measure_backlogs(self) -> None:
        """Each stage's consumer backlog into the metrics, once a step (three cheap reads of
        consumer info; a scrape cannot ask the plane itself, it runs on another thread)."""
        names = self.messages.names
        for consumer in (names.prompt_consumer, names.rollout_consumer, names.scored_consumer):
            try:
                lag = await self.plane.consumer_lag(consumer)
            except DataPlaneError as error:  # the broker away: the gauge keeps its last value
                log.warning("trainer.backlog_unread", consumer=consumer.durable, error=repr(error))
                continue
            CONSUMER_BACKLOG.labels(lag.durable).set(lag.backlog)

    async def _validate(self, step: int, *, log_now: bool = True) -> dict[str, float]:
        if self.evaluator is None:
            return {}
        if self.evaluation_model is not None:  # sharded: the whole copy gets the weights
            self.evaluation_model.load_state_dict(self.ranks.model_state())
        result = await self.evaluator.evaluate()
        metrics = result.as_metrics()
        if self.summary.val_accuracy_start is None:
            self.summary.val_accuracy_start = result.accuracy
        self.summary.val_accuracy_end = result.accuracy
        self.summary.history.append((step, result.accuracy))
        self.status.update(val_accuracy=result.accuracy)
        if log_now:
            self.metrics.log_metrics(metrics, step=step)
        log.info("trainer.validation", step=step, accuracy=result.accuracy)
        log_val_samples(result.samples[: self.config.logger.num_val_samples_to_print], step)
        return metrics

    async def _publish_weights(self) -> None:
        # In policy.precision, on the CPU: what the engines load. No copy when the master
        # weights already are that (float32 on the CPU): training is paused while the blob is
        # written (it is awaited), and the serializer copies only tensors that share storage
        # (tied embeddings).
        state = {
            name: tensor.detach().to("cpu", self.publish_dtype)
            for name, tensor in self.ranks.engine_weights().items()
        }
        # A full snapshot or a sparse patch on the previous version (weight_transport.patches).
        blob = await self.weight_chain.publish(self.weight_version, state)
        ref = blob.ref
        event = WeightVersion(
            version=self.weight_version,
            step=self.step,
            blob_ref=ref.uri,
            digest=ref.digest,
            nbytes=ref.nbytes,
            format=blob.format,
            dtype=str(next(iter(state.values())).dtype).removeprefix("torch."),
            delta_base_version=blob.delta_base_version,
            created_at_unix_s=time.time(),
            producer_id=self.producer_id,
        )
        await self.messages.publish(event)
        self.summary.weight_version = self.weight_version
        self.published_blob = blob
        await self.weights.prune(needed=self.weight_chain.needed)

    def _save_checkpoint(self, metrics: dict[str, float] | None = None) -> None:
        """Blocking (a thread of its own): nothing else changes the trainer while it is
        awaited."""
        assert self.checkpoints is not None
        # Everything from here on may be lost with the steps after this checkpoint: replay it.
        replay_from = min((p.seq for p in self.pending), default=self.last_seq + 1)
        state = TrainerState(
            step=self.step,
            weight_version=self.weight_version,
            dispatcher=self.dispatcher.state_dict(),
            replay_from_seq=replay_from,
            ledger=self.ledger.snapshot(),
            lineage=self.lineage.to_dict(),
        )
        values = {k.replace("/", ":"): v for k, v in (metrics or {}).items()}
        latest = self.checkpoints.latest()
        if latest is not None and latest.step == self.step:
            # A second save of this step (the run's end after a periodic save): it keeps the
            # metrics the first recorded, which rank it for retention (``keep_top_k``).
            values = {**latest.metrics, **values}
        # Gathered from every rank first (collectives), written by this rank alone.
        model_state = self.ranks.model_state()
        training_state = (
            self.ranks.training_state() if self.config.checkpointing.save_optimizer else None
        )
        self.checkpoints.save(
            self.step,
            lambda directory: write_checkpoint(
                directory,
                self.model,
                self.tokenizer,
                state,
                model_state=model_state,
                training_state=training_state,
                model_format=self.config.checkpointing.model_save_format,
                adapter=self.trainer.peft,
            ),
            values,
        )
        self.summary.steps = self.step


def weight_blob_metrics(blob: PublishedBlob | None) -> dict[str, float]:
    """The size of the weight blob just published, and for a patch its changed fraction."""
    if blob is None:
        return {}
    metrics = {"weights/blob_bytes": float(blob.ref.nbytes)}
    if blob.changed_fraction is not None:
        metrics["weights/patch_changed_fraction"] = blob.changed_fraction
    return metrics


def generation_timeline(groups: Iterable[ScoredRollout]) -> dict[str, list[tuple[float, float]]]:
    """Per rollout worker, the (started, finished) Unix times of each sample trained this step,
    as the worker reported them (raw to ``generation_timeline.jsonl``, summarised in metrics)."""
    timeline: dict[str, list[tuple[float, float]]] = {}
    for group in groups:
        samples = group.rollout.samples
        timings = samples.timings
        for worker, started, finished in zip(
            samples.worker_id,
            timings.started_at_unix_s,  # type: ignore[attr-defined]  # a defstruct class (schemas/rollout.py): mypy cannot see its fields
            timings.finished_at_unix_s,  # type: ignore[attr-defined]  # as above
            strict=True,
        ):
            timeline.setdefault(worker, []).append((started, finished))
    return timeline
