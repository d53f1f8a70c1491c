"""Untrusted or broken rollout workers, judged by the log-probs the trainer recomputes.

Every sample carries the log-probs its worker's engine gave the tokens it generated (the
behaviour policy) and the id of that worker. Before a step the trainer recomputes the same
log-probs under its own weights (π_old of the step); an honest worker with current weights
agrees up to numerics and a step or two of staleness, while a worker with wrong weights, a
wrong sampler or tampered outputs does not. Per worker, over its most recent samples:

- ``token_mult_prob_error`` = mean over tokens of exp(|behaviour − trainer|) (1 = agreement),
- ``gen_kl`` = mean over tokens of the k3 estimate of KL(π_behaviour ‖ π_trainer),

the same two quantities the loss reports for the whole batch (``loss/token_mult_prob_error``,
``loss/gen_kl_error``). A worker over either limit (``grpo.worker_trust``) is *flagged*: its
groups are dead-lettered with the worker id in the reason and dropped from the ledger, and the
operator is told (a warning, the ``dockyard_worker_flagged`` gauge, per-worker metrics). Its
samples keep being measured, so a worker that is fixed (refitted, restarted) is cleared again
once its recent samples agree.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from dockyard.broker.plane import DataPlane
from dockyard.config.sections.grpo import WorkerTrustConfig
from dockyard.consumers.trainer.agreement import (
    GEN_KL_SUM,
    MULT_ERROR_SUM,
    TOKENS,
    agreement_sums,
)
from dockyard.consumers.trainer.batch import TrainingBatch, build_batch
from dockyard.consumers.trainer.ledger import Ledger
from dockyard.consumers.trainer.pending_screen import PendingScreen
from dockyard.observability.prometheus import (
    WORKER_FLAGGED,
    WORKER_GEN_KL,
    WORKER_TOKEN_MULT_PROB_ERROR,
)
from dockyard.schemas import ScoredRollout
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: Dead-letter reason of a group from a flagged worker (the worker id follows the colon).
REASON_UNTRUSTED_WORKER = "untrusted_worker"


@dataclass(frozen=True)
class SampleAgreement:
    """One sample's agreement with the trainer, as sums over its response tokens."""

    worker: str
    tokens: int
    mult_error_sum: float
    gen_kl_sum: float


def sample_agreements(
    batch: TrainingBatch, trainer_logprobs: torch.Tensor, workers: Sequence[str]
) -> list[SampleAgreement]:
    """Per sample (row of ``batch``), the agreement of its behaviour log-probs with
    ``trainer_logprobs`` ([B, L-1], as ``PolicyTrainer.batch_logprobs`` returns them)."""
    return agreements_of(agreement_sums(batch, trainer_logprobs), workers)


def agreements_of(sums: torch.Tensor, workers: Sequence[str]) -> list[SampleAgreement]:
    """The rows of :func:`~.agreement.agreement_sums` (one per sample), with their workers."""
    if len(workers) != sums.shape[0]:
        raise ValueError(f"{len(workers)} worker ids for a batch of {sums.shape[0]} samples")
    return [
        SampleAgreement(
            worker, int(row[TOKENS]), float(row[MULT_ERROR_SUM]), float(row[GEN_KL_SUM])
        )
        for worker, row in zip(workers, sums.tolist(), strict=True)
    ]


@dataclass
class WorkerRecord:
    """A worker's recent samples and whether it is flagged."""

    window: deque[SampleAgreement]
    flagged: bool = False
    reason: str = ""

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.window)

    @property
    def token_mult_prob_error(self) -> float:
        return sum(s.mult_error_sum for s in self.window) / max(self.tokens, 1)

    @property
    def gen_kl(self) -> float:
        return sum(s.gen_kl_sum for s in self.window) / max(self.tokens, 1)


@dataclass
class WorkerTrust:
    """Judges workers from their samples' agreement and says which groups to drop."""

    config: WorkerTrustConfig
    workers: dict[str, WorkerRecord] = field(default_factory=dict)

    def judge(
        self, groups: Sequence[ScoredRollout], agreements: Sequence[SampleAgreement]
    ) -> dict[str, str]:
        """Group id → reason, for each group with a sample from a worker flagged once that
        group's samples are counted (samples of ``groups`` are the rows of ``agreements``, in
        order). The first bad group of a worker is dropped already: it is what flags it."""
        drops: dict[str, str] = {}
        rows = iter(agreements)
        for group in groups:
            samples = [next(rows) for _ in range(len(group.rollout.samples))]
            involved = {sample.worker for sample in samples}
            for sample in samples:
                self._record(sample.worker).window.append(sample)
            for worker in sorted(involved):
                record = self._update(worker)
                if record.flagged:
                    drops[group.group_id] = f"{REASON_UNTRUSTED_WORKER}:{worker}"
        if next(rows, None) is not None:
            raise ValueError("more sample agreements than the groups' samples")
        return drops

    def detail(self, reason: str) -> str:
        worker = reason.removeprefix(f"{REASON_UNTRUSTED_WORKER}:")
        record = self.workers.get(worker)
        return record.reason if record is not None else reason

    def _record(self, worker: str) -> WorkerRecord:
        if worker not in self.workers:
            self.workers[worker] = WorkerRecord(deque(maxlen=self.config.window_samples))
        return self.workers[worker]

    def _update(self, worker: str) -> WorkerRecord:
        record = self.workers[worker]
        cfg = self.config
        mult, kl, tokens = record.token_mult_prob_error, record.gen_kl, record.tokens
        WORKER_TOKEN_MULT_PROB_ERROR.labels(worker).set(mult)
        WORKER_GEN_KL.labels(worker).set(kl)
        if tokens < cfg.min_tokens:
            return record
        over = []
        if mult > cfg.max_token_mult_prob_error:
            over.append(f"token_mult_prob_error {mult:.4g} > {cfg.max_token_mult_prob_error:g}")
        if kl > cfg.max_gen_kl:
            over.append(f"gen_kl {kl:.4g} > {cfg.max_gen_kl:g}")
        flagged = bool(over)
        if flagged:
            record.reason = (
                f"rollout worker {worker} disagrees with the trainer's log-probs over its last "
                f"{len(record.window)} samples ({tokens} tokens): {', '.join(over)} "
                "(grpo.worker_trust); its groups are not trained"
            )
        if flagged and not record.flagged:
            log.warning("trainer.worker_flagged", worker=worker, detail=record.reason)
        elif record.flagged and not flagged:
            log.warning(
                "trainer.worker_cleared",
                worker=worker,
                token_mult_prob_error=round(mult, 4),
                gen_kl=round(kl, 6),
            )
        record.flagged = flagged
        WORKER_FLAGGED.labels(worker).set(float(flagged))
        return record

    def metrics(self) -> dict[str, float]:
        """Per worker, for metrics.jsonl: its agreement and whether it is flagged."""
        out: dict[str, float] = {}
        for worker, record in sorted(self.workers.items()):
            out[f"workers/{worker}/token_mult_prob_error"] = record.token_mult_prob_error
            out[f"workers/{worker}/gen_kl"] = record.gen_kl
            out[f"workers/{worker}/flagged"] = float(record.flagged)
        out["workers/flagged"] = float(sum(r.flagged for r in self.workers.values()))
        return out


def workers_of(groups: Iterable[ScoredRollout]) -> list[str]:
    """The worker id of every sample of ``groups``, in batch row order."""
    return [worker for group in groups for worker in group.rollout.samples.worker_id]


class WorkerScreen(PendingScreen):
    """The trainer's use of :class:`WorkerTrust`: before a step, measure the groups not judged
    yet, and dead-letter (and drop from the ledger) those of flagged workers.

    ``measure``: a batch's :func:`~.agreement.agreement_sums` under the trainer's weights
    (``TrainerRanks.agreement_sums``: with several ranks each measures its share and rank 0
    gathers the rows, so the judgement is the one a single process makes)."""

    event = "trainer.dropped_untrusted"

    def __init__(
        self,
        config: WorkerTrustConfig,
        measure: Callable[[TrainingBatch], torch.Tensor],
        pad_token_id: int,
        plane: DataPlane,
        ledger: Callable[[], Ledger],
    ) -> None:
        super().__init__(plane, ledger)
        self.trust = WorkerTrust(config)
        self.measure = measure
        self.pad_token_id = pad_token_id

    async def refusals(self, fresh: list[ScoredRollout]) -> dict[str, tuple[str, str]]:
        batch = build_batch(fresh, self.pad_token_id)
        sums = await asyncio.to_thread(self.measure, batch)
        drops = self.trust.judge(fresh, agreements_of(sums, workers_of(fresh)))
        return {group: (reason, self.trust.detail(reason)) for group, reason in drops.items()}
