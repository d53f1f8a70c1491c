"""The trainer's intake: scored groups pulled (or replayed) from the data plane, decoded, checked
against the ledger and the age limit, and held until a step takes them.

Staleness: a group whose oldest token came from weight version ``g`` is trained only while the
steps from ``g`` to the trainer's current version are at most ``max_trajectory_age_steps``
(async) or zero (sync), checked when it comes in and again after every step; older groups are
dropped, counted and written to the ledger. Steps are counted along the lineage of versions
(``lineage.py``), so a resume, which publishes the checkpoint's weights under a new number, does
not age the groups it left behind, and a group of a lost step is judged at the step it is
retrained at just as the crashed run judged it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dockyard.algorithms.rewards import dynamic_sampling_filter
from dockyard.broker.typed import MessagePlane
from dockyard.config.master import MasterConfig
from dockyard.consumers.trainer.progress import Progress
from dockyard.schemas import CodecError, ScoredRollout, decode
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Pending:
    """A scored group waiting for a step, with its place in the scored stream."""

    scored: ScoredRollout
    seq: int
    received_at: float


class Intake:
    def __init__(self, config: MasterConfig, messages: MessagePlane, progress: Progress) -> None:
        self.config = config
        self.messages = messages
        self.progress = progress
        self.pending: list[Pending] = []
        self.last_seq = 0  # highest scored-stream sequence taken in
        self.zero_variance_this_step = 0

    async def pull(self) -> bool:
        """Take in what the scored consumer has (acked as taken: the ledger and the checkpoint's
        replay position make that safe); whether anything came."""
        plane = self.config.data_plane
        received = await self.messages.fetch(
            self.messages.names.scored_consumer,
            ScoredRollout,
            batch=plane.consumer.fetch_batch if plane else 16,
            timeout_s=0.5,
        )
        for item in received:
            self.take(item.message, item.delivery.seq)
            await item.ack()
        return bool(received)

    async def replay(self, from_seq: int) -> None:
        """The scored stream from ``from_seq`` on (a resume: the groups of the lost steps)."""
        count = skipped = 0
        messages = self.messages
        async for stored in messages.plane.replay(messages.names.scored, from_seq=from_seq):
            try:
                scored = decode(
                    stored.headers, stored.data, limits=messages.limits, expected=ScoredRollout
                )
            except CodecError as error:
                # Refused when it first arrived (it is in the dead letters), or its chunks aged
                # out since: the dispatcher's lost-group check accounts for its group.
                skipped += 1
                log.warning("trainer.replay_skipped", seq=stored.seq, reason=error.reason.value)
                continue
            self.take(scored, stored.seq)
            count += 1
        log.info(
            "trainer.replayed",
            from_seq=from_seq,
            messages=count,
            skipped=skipped,
            pending=len(self.pending),
        )

    def take(self, scored: ScoredRollout, seq: int) -> None:
        self.last_seq = max(self.last_seq, seq)
        group_id = scored.group_id
        ledger = self.progress.ledger
        if ledger.seen(group_id) or any(p.scored.group_id == group_id for p in self.pending):
            self.progress.summary.duplicates += 1
            return
        if self._dropped_as_stale(scored):
            return
        if self._drop_for_dynamic_sampling(scored):
            return
        self.pending.append(Pending(scored, seq, time.monotonic()))

    def stepped(self, count: int) -> None:
        """A step trained the first ``count`` pending groups: they leave, and the rest aged by
        one version (dropped if that puts them over the limit)."""
        self.zero_variance_this_step = 0
        self.pending = [p for p in self.pending[count:] if not self._dropped_as_stale(p.scored)]

    def replay_from(self) -> int:
        """The first scored-stream sequence a checkpoint taken now must replay from: everything
        still pending may be lost with the steps after it."""
        return min((p.seq for p in self.pending), default=self.last_seq + 1)

    def awaited_groups(self) -> set[str]:
        """Groups dispatched and not settled that have not reached the trainer yet."""
        return self.progress.ledger.open_groups() - {p.scored.group_id for p in self.pending}

    def drop_exhausted(self, per_step: int) -> None:
        """The dataset is used up and what is pending is less than a step: drop it, say why."""
        for pending in self.pending:
            self.progress.ledger.record_dropped(
                pending.scored.group_id,
                f"dataset exhausted: {len(self.pending)} groups left, "
                f"fewer than a step's {per_step}",
            )
        self.pending = []

    def drop_lost_groups(self) -> None:
        """Groups dispatched but found nowhere in the pipeline (dead-lettered, or deduplicated
        away after a restart) would hold the dispatcher's budget forever: drop them, say so."""
        ledger = self.progress.ledger
        awaited = self.awaited_groups()
        lost = [g for g in ledger.dispatched if g in awaited]  # in dispatch order
        for group_id in lost:
            ledger.record_dropped(group_id, "lost: not found in any stage")
        log.warning("trainer.dropped_lost_groups", count=len(lost))

    def _dropped_as_stale(self, scored: ScoredRollout) -> bool:
        """Drop (and record) a group whose oldest token is older than the age limit allows at
        the current version. Checked when a group comes in and again after every step, so no
        group is trained past the limit however long it waited."""
        progress = self.progress
        oldest = scored.rollout.samples.min_weight_version()
        # The oldest token decides; steps are counted along the lineage (resumes included).
        age = progress.lineage.age(oldest, progress.weight_version) if oldest is not None else 0
        async_grpo = self.config.grpo.async_grpo
        max_age = async_grpo.max_trajectory_age_steps if async_grpo.enabled else 0
        if age <= max_age:
            return False
        progress.ledger.record_dropped(scored.group_id, f"stale: age {age} > {max_age}")
        progress.summary.dropped_stale += 1
        return True

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
        self.progress.ledger.record_dropped(
            scored.group_id, "dynamic sampling: zero reward variance"
        )
        return True
