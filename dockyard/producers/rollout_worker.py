"""The rollout worker: prompt groups in, rollouts out, weights followed by version.

Delivery: a prompt group is acked only after its rollout is stored in the experience stream, so
a worker that dies mid-generation loses nothing (the group is redelivered to another worker and
the rollout's message id — group id + attempt — makes a late duplicate harmless).

Refit: a background task follows weight-version events, fetches the blob (the store verifies its
digest; a mismatch is refused and the old weights stay), and hands it to the engine, whose
in-flight policy decides what happens to a batch being decoded. Every token records the version
that produced it either way.

Multi-turn (``grpo.max_rollout_turns`` > 1 with ``grpo.structured_tool_use``): every sample is an
episode of :mod:`dockyard.producers.episodes`; refits between turns follow
``grpo.async_grpo.in_flight_weight_updates`` (:mod:`dockyard.producers.refit_gate`), and a group
with more failed episodes than ``grpo.async_grpo.max_generation_failures`` is not published but
retried like an engine failure (redelivered, replayed from scratch, dead-lettered at its last
delivery).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from PIL import Image

from dockyard.broker.plane import StreamFull
from dockyard.broker.typed import MessagePlane, Received
from dockyard.broker.weight_blobs.base import BlobDigestMismatch, BlobNotFound, WeightBlobStore
from dockyard.broker.weight_blobs.chain import ChainFollower
from dockyard.broker.weight_blobs.patch import PatchError
from dockyard.engines.base import (
    GenerationEngine,
    GenerationRequest,
    SamplingParams,
)
from dockyard.environments.tools.toolbox import (
    TaskRefused,
    ToolServiceUnavailable,
    UnknownToolboxError,
)
from dockyard.models.vision import encode_png
from dockyard.observability.prometheus import GENERATED_TOKENS, REFIT_DURATION
from dockyard.observability.status_files import RUNNING, STARTING, StatusFile
from dockyard.producers.episodes import EpisodeRunner
from dockyard.producers.multimodal import ImageInputError, MultimodalLimits, gate_sample_images
from dockyard.producers.refit_gate import RefitGate
from dockyard.producers.rollout_assembly import build_episode_rollout, build_rollout
from dockyard.schemas import EngineInfo, PromptGroup, WeightVersion
from dockyard.utils.logging import get_logger
from dockyard.utils.tasks import spawn

log = get_logger(__name__)

#: Dead-letter reason of a group the engine failed on, alone, at its last delivery.
REASON_ENGINE_ERROR = "engine_error"
#: A group whose rollout a full experience stream kept refusing at its last delivery.
REASON_STREAM_FULL = "stream_full"
#: Dead-letter reason of a group with too many failed episodes, at its last delivery.
REASON_EPISODES_FAILED = "episodes_failed"
#: Dead-letter reason of a multi-turn group whose environment has no toolbox.
REASON_NO_TOOLBOX = "no_toolbox"
#: After the weight-event watch broke (the broker, not the events): when to watch again.
_WATCH_RETRY_S = 1.0


class WorkerUnhealthy(RuntimeError):
    """Repeated engine failures: the worker stops taking work and exits non-zero."""


class EpisodesFailed(RuntimeError):
    """More failed episodes in a group than ``grpo.async_grpo.max_generation_failures``."""


class RolloutWorker:
    def __init__(
        self,
        messages: MessagePlane,
        weights: WeightBlobStore,
        engine: GenerationEngine,
        params: SamplingParams,
        *,
        worker_id: str,
        engine_info: EngineInfo,
        fetch_batch: int = 16,
        nak_delay_s: float = 1.0,
        max_consecutive_failures: int = 3,
        simulated_latency_per_token_s: float = 0.0,
        max_refit_wait_s: float = 10.0,
        multimodal: MultimodalLimits | None = None,
        status: StatusFile | None = None,
        episodes: EpisodeRunner | None = None,
        max_generation_failures: int = 0,
        in_flight_weight_updates: bool = False,
    ) -> None:
        self.messages = messages
        self.weights = weights
        patches = messages.plane.config.weight_transport.patches
        self.weight_chain = ChainFollower(weights, retain=patches.enabled)
        self.engine = engine
        self.params = params
        self.worker_id = worker_id
        self.engine_info = engine_info
        self.fetch_batch = fetch_batch
        self.nak_delay_s = nak_delay_s
        self.max_deliver = messages.plane.config.consumer.max_deliver
        self.max_consecutive_failures = max_consecutive_failures
        self.simulated_latency_per_token_s = simulated_latency_per_token_s
        self.status = status or StatusFile(None, "rollout", worker_id)
        #: What kept part of the batch in hand from going through (its status detail).
        self.batch_problem = ""
        self.stopping = asyncio.Event()
        # Generate only with published weights: the first weight event is loaded before work.
        self.weights_ready = asyncio.Event()
        self.version_changed = asyncio.Condition()
        self.max_refit_wait_s = max_refit_wait_s
        self.multimodal = multimodal or MultimodalLimits()
        # None: one generation per sample (single-turn).
        self.episodes = episodes
        self.max_generation_failures = max_generation_failures
        self.refit_gate = RefitGate(in_flight_weight_updates=in_flight_weight_updates)
        self.failed_episodes = 0
        self.refused_groups = 0
        self.groups_done = 0
        self.failures = 0
        self.refits = 0
        self.refused_refits = 0
        self.failed_refits = 0
        self.last_refit_latency_s = 0.0

    def stop(self) -> None:
        """Graceful drain: finish the batch in hand, publish it, then return from ``run``."""
        self.stopping.set()

    async def run(self) -> None:
        follower = spawn(self.follow_weights(), name="weight-follower")
        # Not ready until the first weights are in the engine: the trainer does not count its
        # starvation time while a worker it waits for is still starting.
        self.status.update(STARTING, detail="waiting for the first weights")
        try:
            await self.generation_loop()
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            if self.episodes is not None:
                await self.episodes.aclose()
            self.status.update("stopped")

    async def generation_loop(self) -> None:
        consecutive_failures = 0
        consumer = self.messages.names.prompt_consumer
        await self._first_weights_or_stop()
        if not self.stopping.is_set():
            self.status.update(RUNNING, detail="")
        while not self.stopping.is_set():
            received = await self.messages.fetch(
                consumer, PromptGroup, batch=self.fetch_batch, timeout_s=0.5
            )
            if not received:
                continue
            try:
                async with self.messages.kept_in_progress(received):
                    await self.process(received)
                consecutive_failures = 0
            except StreamFull as full:
                # Not the engine's fault: the stream's readers are behind. The groups go back
                # (nak'ed with backoff, dead-lettered with the reason at their last delivery)
                # and the worker stays healthy, naming the stream on its status.
                log.warning("rollout.stream_full", stream=full.stream, groups=len(received))
                self.status.update(detail=f"stream {full.stream} is full: waiting for room")
                for item in received:
                    if not item.delivery.settled:
                        await self.retry_group(item, REASON_STREAM_FULL, full)
            except Exception as error:  # an engine failure must not lose the work
                self.failures += 1
                log.error("rollout.engine_failed", error=repr(error), groups=len(received))
                self.status.update(detail=f"engine error: {error!r}", failures=self.failures)
                if await self.retry_one_by_one(received, error):
                    consecutive_failures = 0  # the engine works: some group was the problem
                    continue
                consecutive_failures += 1
                if consecutive_failures >= self.max_consecutive_failures:
                    self.status.update("unhealthy", detail=f"engine error: {error!r}")
                    raise WorkerUnhealthy(
                        f"{consecutive_failures} consecutive engine failures; last: {error!r}"
                    ) from error

    async def _first_weights_or_stop(self) -> None:
        """Wait until the follower has loaded a version or the worker is asked to stop."""
        # Both waiters go away with the wait: a timed loop that made new ones each second left
        # them pending (two tasks a second) for as long as the first weights took.
        waiters = [asyncio.ensure_future(e.wait()) for e in (self.weights_ready, self.stopping)]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def retry_one_by_one(
        self, received: Sequence[Received[PromptGroup]], error: Exception
    ) -> bool:
        """After a failed batch, each group not settled yet on its own: one group that breaks
        the engine must not take the others' deliveries with it. A group that fails alone is
        nak'ed with backoff, and dead-lettered with the engine's error at its last delivery.
        True when any group went through (the engine itself works)."""
        unsettled = [item for item in received if not item.delivery.settled]
        worked = False
        for item in unsettled:
            failure = error  # a group that was alone in the batch has failed alone already
            if len(unsettled) > 1:
                try:
                    async with self.messages.kept_in_progress([item]):
                        await self.process([item])
                    worked = True
                    continue
                except Exception as alone:
                    failure = alone
            if not item.delivery.settled:
                await self.retry_group(item, REASON_ENGINE_ERROR, failure)
        return worked

    async def retry_group(
        self, item: Received[PromptGroup], reason: str, error: BaseException
    ) -> None:
        """Nak with backoff for another try; dead-letter with ``reason`` at the last delivery."""
        await self.messages.retry_later(
            item,
            reason,
            error,
            base_delay_s=self.nak_delay_s,
            max_deliver=self.max_deliver,
            stage="rollout",
        )

    async def process(self, received: Sequence[Received[PromptGroup]]) -> None:
        started = time.time()
        self.batch_problem = ""
        # Generate with weights at least as new as those current when the group was dispatched
        # (the weight event may still be on its way); bounded, so a refused refit cannot wedge.
        await self.wait_for_version(
            max(item.message.dispatch_weight_version for item in received),
            self.max_refit_wait_s,
        )
        accepted: list[tuple[Received[PromptGroup], list[Image.Image]]] = []
        for item in received:
            try:
                images = gate_sample_images(
                    item.message.images,
                    self.multimodal,
                    backend=self.engine.backend,
                    accepts_images=self.engine.accepts_images,
                )
            except ImageInputError as error:
                # Bad input is refused at the boundary with its reason, never sent to an engine.
                await self.messages.plane.dead_letter(
                    item.delivery, error.reason, str(error), stage="rollout"
                )
                self.refused_groups += 1
                continue
            accepted.append((item, images))
        if self.episodes is None:
            await self.generate_single_turn(accepted, started)
        else:
            await self.run_episodes(self.episodes, accepted, started)
        # A batch that went through clears what the last one reported (engine error, full
        # stream); one whose sessions could not open says why.
        self.status.update(
            detail=self.batch_problem,
            groups=self.groups_done,
            failed_episodes=self.failed_episodes,
            weight_version=self.engine.current_version,
            seconds_per_batch=time.time() - started,
        )

    async def generate_single_turn(
        self, accepted: Sequence[tuple[Received[PromptGroup], list[Image.Image]]], started: float
    ) -> None:
        by_size: dict[int, list[tuple[Received[PromptGroup], list[Image.Image]]]] = {}
        for item, images in accepted:
            by_size.setdefault(item.message.num_generations, []).append((item, images))
        for num_generations, entries in by_size.items():
            items = [item for item, _ in entries]
            requests = [
                GenerationRequest(
                    item.message.prompt_token_ids.tolist(), item.message.group_id, images
                )
                for item, images in entries
            ]
            results = await self.engine.generate(requests, self.params, num_generations)
            GENERATED_TOKENS.inc(sum(result.num_tokens for result in results))
            if self.simulated_latency_per_token_s:
                # A batched engine decodes one token per step for the longest sample.
                longest = max(result.num_tokens for result in results)
                await asyncio.sleep(longest * self.simulated_latency_per_token_s)
            rollouts = [
                build_rollout(
                    item.message,
                    results[index * num_generations : (index + 1) * num_generations],
                    self.params,
                    engine=self.engine_info,
                    worker_id=self.worker_id,
                    started_at_unix_s=started,
                    # The normalised images the engine saw, losslessly: what the trainer feeds.
                    images=[encode_png(image) for image in images],
                )
                for index, (item, images) in enumerate(entries)
            ]
            await self.messages.publish_many(rollouts, answers=[i.delivery for i in items])
            for item in items:
                await item.ack()  # only once the rollout is stored
            self.groups_done += len(items)

    async def run_episodes(
        self,
        runner: EpisodeRunner,
        accepted: Sequence[tuple[Received[PromptGroup], list[Image.Image]]],
        started: float,
    ) -> None:
        opened = []
        try:
            for item, images in accepted:
                try:
                    starts = await runner.open_group(
                        item.message, images, item.delivery.num_delivered
                    )
                except UnknownToolboxError as error:
                    await self.messages.plane.dead_letter(
                        item.delivery, REASON_NO_TOOLBOX, str(error), stage="rollout"
                    )
                    self.refused_groups += 1
                    continue
                except TaskRefused as error:  # the task's fault: replaying cannot help
                    await self.messages.plane.dead_letter(
                        item.delivery, error.reason, str(error), stage="rollout"
                    )
                    self.refused_groups += 1
                    continue
                except ToolServiceUnavailable as error:  # no sandbox: try again later
                    # None of the group's episodes could start: each counts as failed.
                    self.failed_episodes += item.message.num_generations
                    log.warning(
                        "episodes.tool_service_unavailable",
                        group_id=item.message.group_id,
                        delivery=item.delivery.num_delivered,
                        error=str(error),
                    )
                    await self.retry_group(item, REASON_EPISODES_FAILED, error)
                    # On the status, so the live table and a starving trainer name the cause.
                    self.batch_problem = f"tool service unavailable: {error}"
                    continue
                opened.append((item, starts))
            async with self.refit_gate.episodes():
                episodes = await runner.run([start for _, starts in opened for start in starts])
        finally:
            await runner.close([start for _, starts in opened for start in starts])
        offset = 0
        for item, starts in opened:
            group_episodes = episodes[offset : offset + len(starts)]
            offset += len(starts)
            failed = [episode for episode in group_episodes if episode.failure is not None]
            self.failed_episodes += len(failed)
            if len(failed) > self.max_generation_failures:
                log.warning(
                    "episodes.failed",
                    group_id=item.message.group_id,
                    delivery=item.delivery.num_delivered,
                    failed=len(failed),
                    first=str(failed[0].failure),
                )
                failure = EpisodesFailed(
                    f"{len(failed)} of {len(starts)} episodes failed (at most "
                    f"{self.max_generation_failures} allowed); first: {failed[0].failure}"
                )
                await self.retry_group(item, REASON_EPISODES_FAILED, failure)
                continue
            GENERATED_TOKENS.inc(sum(sum(episode.loss_mask) for episode in group_episodes))
            rollout = build_episode_rollout(
                item.message,
                group_episodes,
                self.params,
                engine=self.engine_info,
                worker_id=self.worker_id,
                started_at_unix_s=started,
            )
            await self.messages.publish_many([rollout], answers=[item.delivery])
            await item.ack()  # only once the rollout is stored
            self.groups_done += 1

    async def wait_for_version(self, version: int, timeout_s: float) -> None:
        async def reached() -> None:
            async with self.version_changed:
                await self.version_changed.wait_for(lambda: self.engine.current_version >= version)

        try:
            async with asyncio.timeout(timeout_s):
                await reached()
        except TimeoutError:
            log.warning(
                "rollout.stale_weights",
                wanted=version,
                have=self.engine.current_version,
                waited_s=timeout_s,
            )

    async def follow_weights(self) -> None:
        """Refit on every new weight version, for as long as the worker runs: a refit that
        fails keeps the old weights (the next version tries again), a broken watch restarts."""
        while True:
            try:
                async for event in self.messages.weight_versions():
                    if event.version <= self.engine.current_version and self.refits:
                        continue
                    try:
                        async with self.refit_gate.refit():
                            await self.refit(event)
                    except Exception as error:  # an engine or transport failure, not a bug
                        self.failed_refits += 1
                        log.error("refit.failed", version=event.version, error=repr(error))
                        self.status.update(detail=f"refit v{event.version} failed: {error!r}")
                return  # the plane closed the watch: the worker is stopping
            except Exception as error:
                log.error("weights.watch_failed", error=repr(error))
                await asyncio.sleep(_WATCH_RETRY_S)

    async def refit(self, event: WeightVersion) -> None:
        started = time.perf_counter()
        try:
            # A snapshot, or a patch on the weights held (or caught up to from its chain).
            tensors = await self.weight_chain.resolve(event)
        except (BlobDigestMismatch, BlobNotFound, PatchError) as error:
            # Corrupt or missing bytes never reach the engine: the old weights stay in use.
            self.refused_refits += 1
            log.error("refit.refused", version=event.version, reason=str(error))
            self.status.update(detail=f"refused v{event.version}: {type(error).__name__}")
            return
        await self.engine.update_weights(event.version, tensors)
        self.weights_ready.set()
        async with self.version_changed:
            self.version_changed.notify_all()
        self.refits += 1
        self.last_refit_latency_s = time.perf_counter() - started
        REFIT_DURATION.observe(self.last_refit_latency_s)
        log.info(
            "refit.done",
            version=event.version,
            format=event.format,
            nbytes=event.nbytes,
            seconds=self.last_refit_latency_s,
        )
        self.status.update(weight_version=event.version, refit_s=self.last_refit_latency_s)
