"""Engine results → :class:`Rollout` (what a rollout worker publishes)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from dockyard.engines.base import GenerationResult
from dockyard.engines.base import SamplingParams as EngineSamplingParams
from dockyard.producers.episodes import Episode
from dockyard.schemas import (
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleTimings,
    SamplingParams,
)


def wire_sampling_params(params: EngineSamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k is not None else -1,
        max_new_tokens=params.max_new_tokens,
        seed=params.seed,
        stop=list(params.stop_strings),
    )


def build_rollout(
    group: PromptGroup,
    results: Sequence[GenerationResult],
    params: EngineSamplingParams,
    *,
    engine: EngineInfo,
    worker_id: str,
    started_at_unix_s: float,
    queue_wait_s: float | None = None,
) -> Rollout:
    """One group's samples, in ``sample_index`` order, with per-token versions and log-probs."""
    sampling = wire_sampling_params(params)
    prompt = np.asarray(group.prompt_token_ids, dtype=np.int32)
    finished = time.time()
    samples = [
        RolloutSample(
            sample_index=index,
            prompt_token_ids=prompt,
            response_token_ids=result.token_ids.astype(np.int32, copy=False),
            behaviour_logprobs=result.logprobs.astype(np.float32, copy=False),
            token_weight_versions=result.weight_versions.astype(np.int64, copy=False),
            loss_mask=np.ones(result.num_tokens, dtype=np.uint8),
            finish_reason=result.finish_reason,
            sampling=sampling,
            engine=engine,
            worker_id=worker_id,
            timings=SampleTimings(
                started_at_unix_s=started_at_unix_s,
                finished_at_unix_s=finished,
                time_to_first_token_s=result.timings.first_token_s,
                queue_wait_s=queue_wait_s,
            ),
        )
        for index, result in enumerate(results)
    ]
    return Rollout(group=group, samples=samples, created_at_unix_s=finished)


def _trained_tokens(episode: Episode) -> np.ndarray:
    """The episode's loss mask; none of a failed episode's tokens: the infrastructure cut it
    short, not the model (it travels for accounting, as ``finish_reason="error"``)."""
    if episode.failure is not None:
        return np.zeros(len(episode.token_ids), dtype=np.uint8)
    return np.asarray(episode.loss_mask, dtype=np.uint8)


def build_episode_rollout(
    group: PromptGroup,
    episodes: Sequence[Episode],
    params: EngineSamplingParams,
    *,
    engine: EngineInfo,
    worker_id: str,
    started_at_unix_s: float,
) -> Rollout:
    """One group's multi-turn samples: observation tokens masked, turns as segments."""
    sampling = wire_sampling_params(params)
    prompt = np.asarray(group.prompt_token_ids, dtype=np.int32)
    finished = time.time()
    samples = [
        RolloutSample(
            sample_index=index,
            prompt_token_ids=prompt,
            response_token_ids=np.asarray(episode.token_ids, dtype=np.int32),
            behaviour_logprobs=np.asarray(episode.logprobs, dtype=np.float32),
            token_weight_versions=np.asarray(episode.versions, dtype=np.int64),
            loss_mask=_trained_tokens(episode),
            finish_reason=episode.finish_reason,
            sampling=sampling,
            engine=engine,
            worker_id=worker_id,
            timings=SampleTimings(
                started_at_unix_s=started_at_unix_s,
                finished_at_unix_s=finished,
                time_to_first_token_s=episode.first_token_s,
            ),
            segments=episode.segments,
            tool_calls=episode.tool_calls,
        )
        for index, episode in enumerate(episodes)
    ]
    return Rollout(group=group, samples=samples, created_at_unix_s=finished)
