"""The scorer: a pool of instances sharing one durable consumer of raw rollouts.

Each instance keeps up to ``max_concurrency`` groups in flight. A scored rollout is published
*before* the rollout is acked; a redelivered rollout yields the same message id (group id +
attempt), so the broker's dedupe window drops the second copy. Environment failures nak with
exponential backoff and become dead letters after ``max_deliver`` deliveries; bad input that no
retry can fix (:class:`InvalidScoringInput`) is dead-lettered at once.

A group with a sample the environment flags ``suspected_reward_hack`` is scored as scored (those
samples get 0) *and* copied to the dead-letter stream as ``suspected_reward_hack`` with the
evidence: the dead-letter metric and the dashboard's dead-letter page then show a policy that
starts to hack, while training still sees the zeros.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from dockyard.broker.plane import DataPlaneError
from dockyard.broker.typed import MessagePlane, Received
from dockyard.consumers.score_conversion import (
    OutputChecks,
    to_scored_rollout,
    to_scoring_group,
    with_output_flags,
)
from dockyard.environments.base import (
    Environment,
    EnvironmentContext,
    InvalidScoringInput,
    ScoreFlag,
)
from dockyard.environments.registry import build_environment
from dockyard.environments.timeouts import score_with_timeout
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import Rollout
from dockyard.utils.logging import get_logger
from dockyard.utils.tasks import spawn

log = get_logger(__name__)

REASON_ENVIRONMENT_ERROR = "environment_error"
REASON_SUSPECTED_REWARD_HACK = "suspected_reward_hack"


@dataclass
class EnvironmentStats:
    groups: int = 0
    timeouts: int = 0
    failures: int = 0
    suspected_reward_hacks: int = 0  # samples flagged by the environment's reward-hack screen
    latency_s_total: float = 0.0

    @property
    def mean_latency_s(self) -> float:
        return self.latency_s_total / self.groups if self.groups else 0.0


@dataclass
class ScorerStats:
    by_env: dict[str, EnvironmentStats] = field(
        default_factory=lambda: defaultdict(EnvironmentStats)
    )
    dead_lettered: Counter[str] = field(default_factory=Counter)


class Scorer:
    def __init__(
        self,
        messages: MessagePlane,
        context: EnvironmentContext,
        tokenizer: object,
        *,
        scorer_id: str,
        only_env: str | None = None,
        max_concurrency: int = 8,
        max_deliver: int = 5,
        nak_delay_s: float = 1.0,
        status: StatusFile | None = None,
        output_checks: OutputChecks | None = None,
    ) -> None:
        self.messages = messages
        self.output_checks = output_checks or OutputChecks()
        self.context = context
        self.tokenizer = tokenizer
        self.scorer_id = scorer_id
        self.only_env = only_env
        self.max_deliver = max_deliver
        self.nak_delay_s = nak_delay_s
        self.slots = asyncio.Semaphore(max_concurrency)
        self.max_concurrency = max_concurrency
        self.environments: dict[str, Environment] = {}
        self.stats = ScorerStats()
        self.status = status or StatusFile(None, "scorer", scorer_id)
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        self.stopping.set()

    def environment(self, name: str) -> Environment:
        if name not in self.environments:
            self.environments[name] = build_environment(name, self.context)
        return self.environments[name]

    async def run(self) -> None:
        self.status.update("running")
        tasks: set[asyncio.Task[None]] = set()
        consumer = self.messages.names.rollout_consumer
        try:
            while not self.stopping.is_set():
                free = self.max_concurrency - len(tasks)
                if free <= 0:
                    _, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                received = await self.messages.fetch(consumer, Rollout, batch=free, timeout_s=0.5)
                for item in received:
                    task = spawn(self.score_one(item), name=f"score-seq-{item.delivery.seq}")
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if tasks:
                # Drain what is in hand. A group whose scoring failed is logged by its task and
                # left unsettled (it comes back after its ack wait): it must not stop the scorer.
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for environment in self.environments.values():
                await environment.aclose()
            self.report_stats()
            for env, stats in self.stats.by_env.items():
                log.info(
                    "scorer.env_stats",
                    env=env,
                    groups=stats.groups,
                    mean_latency_s=round(stats.mean_latency_s, 4),
                    timeouts=stats.timeouts,
                    failures=stats.failures,
                )
            self.status.update("stopped")

    async def score_one(self, item: Received[Rollout]) -> None:
        rollout = item.message
        env_name = rollout.group.environment
        stats = self.stats.by_env[env_name]
        started = time.perf_counter()
        try:
            if self.only_env is not None and env_name != self.only_env:
                raise InvalidScoringInput(
                    "wrong_environment", f"this scorer serves {self.only_env!r}, not {env_name!r}"
                )
            environment = self.environment(env_name)
            group = to_scoring_group(rollout, self.tokenizer)
            async with self.messages.kept_in_progress([item]):
                score = await score_with_timeout(environment, group)
            score = with_output_flags(score, rollout, self.tokenizer, self.output_checks)
        except InvalidScoringInput as error:
            await self._dead_letter(item, error.reason_code, str(error))
            return
        except Exception as error:  # an environment bug or an unavailable dependency
            stats.failures += 1
            if await self.messages.retry_later(
                item,
                REASON_ENVIRONMENT_ERROR,
                error,
                base_delay_s=self.nak_delay_s,
                max_deliver=self.max_deliver,
                stage="scorer",
            ):
                self.stats.dead_lettered[REASON_ENVIRONMENT_ERROR] += 1
                log.warning(
                    "scorer.dead_lettered", reason=REASON_ENVIRONMENT_ERROR, detail=repr(error)
                )
                self.report_stats()
            else:
                log.warning("scorer.environment_failed", env=env_name, error=repr(error))
            return
        if any(ScoreFlag.TIMEOUT in sample.flags for sample in score.samples):
            stats.timeouts += 1
        suspected = [
            f"sample {index}: {sample.detail}"
            for index, sample in enumerate(score.samples)
            if ScoreFlag.SUSPECTED_REWARD_HACK in sample.flags
        ]
        if suspected:
            stats.suspected_reward_hacks += len(suspected)
            await self._report_suspected_hack(item, env_name, suspected)
        try:
            await self.messages.publish(
                to_scored_rollout(rollout, score, self.scorer_id), answers=item.delivery
            )
            await item.ack()
        except DataPlaneError as error:  # the broker, not the group: score it again later
            stats.failures += 1
            log.error("scorer.publish_failed", env=env_name, error=repr(error))
            if not item.delivery.settled:
                with contextlib.suppress(DataPlaneError):
                    await item.nak(self.nak_delay_s)
            return
        stats.groups += 1
        stats.latency_s_total += time.perf_counter() - started
        self.report_stats()

    def report_stats(self) -> None:
        """Totals, and per environment: groups, mean latency, timeouts, failures."""
        per_env = {
            f"{env}/{name}": value
            for env, stats in self.stats.by_env.items()
            for name, value in (
                ("groups", stats.groups),
                ("mean_latency_s", stats.mean_latency_s),
                ("timeouts", stats.timeouts),
                ("failures", stats.failures),
                ("suspected_reward_hacks", stats.suspected_reward_hacks),
            )
        }
        self.status.update(
            groups=sum(s.groups for s in self.stats.by_env.values()),
            failures=sum(s.failures for s in self.stats.by_env.values()),
            timeouts=sum(s.timeouts for s in self.stats.by_env.values()),
            dead_lettered=sum(self.stats.dead_lettered.values()),
            **per_env,  # type: ignore[arg-type]  # env/<name>/... counters, never state or detail
        )

    async def _report_suspected_hack(
        self, item: Received[Rollout], env_name: str, evidence: list[str]
    ) -> None:
        """A copy of the rollout on the dead-letter stream with the evidence; the delivery stays
        ours (it is scored and acked as any other). Its id is the rollout's, so a redelivery
        reports it once."""
        detail = f"{env_name}: " + " | ".join(evidence)
        try:
            await self.messages.plane.publish_dead_letter(
                item.delivery.as_stored(),
                REASON_SUSPECTED_REWARD_HACK,
                detail,
                stage="scorer",
                delivery_count=item.delivery.num_delivered,
            )
        except DataPlaneError as error:  # the score matters more than the report
            log.error("scorer.suspected_hack_unreported", env=env_name, error=repr(error))
            return
        self.stats.dead_lettered[REASON_SUSPECTED_REWARD_HACK] += 1
        log.warning("scorer.suspected_reward_hack", env=env_name, detail=detail[:500])

    async def _dead_letter(self, item: Received[Rollout], reason: str, detail: str) -> None:
        self.stats.dead_lettered[reason] += 1
        await self.messages.plane.dead_letter(item.delivery, reason, detail, stage="scorer")
        log.warning("scorer.dead_lettered", reason=reason, detail=detail)
