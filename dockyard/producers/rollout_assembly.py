"""Engine results → :class:`Rollout` (what a rollout worker publishes)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dockyard.engines.base import GenerationResult
from dockyard.engines.base import SamplingParams as EngineSamplingParams
from dockyard.models.vision import encode_png
from dockyard.producers.episodes import Episode
from dockyard.schemas import (
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleTimings,
    SamplingParams,
    Segment,
    ToolCall,
)
from dockyard.schemas.rollout import SampleColumns, finish_reason_of


def wire_sampling_params(params: EngineSamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k is not None else -1,
        max_new_tokens=params.max_new_tokens,
        seed=params.seed,
        stop=list(params.stop_strings),
    )


@dataclass(frozen=True)
class _Generated:
    """What differs between the samples of a group: their tokens and how they ended."""

    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    loss_mask: np.ndarray
    finish_reason: str
    first_token_s: float | None
    segments: Sequence[Segment] = ()
    tool_calls: Sequence[ToolCall] = ()
    #: The prompt ids the model attended to, when not the group's (image placeholders expanded).
    prompt_token_ids: np.ndarray | None = None
    images: Sequence[bytes] = ()  # PNG files, one per placeholder run


def _assemble(
    group: PromptGroup,
    generated: Sequence[_Generated],
    params: EngineSamplingParams,
    *,
    engine: EngineInfo,
    worker_id: str,
    started_at_unix_s: float,
    queue_wait_s: float | None,
) -> Rollout:
    sampling = wire_sampling_params(params)
    prompt = np.asarray(group.prompt_token_ids, dtype=np.int32)
    finished = time.time()
    samples = [
        RolloutSample(
            sample_index=index,
            prompt_token_ids=(
                prompt
                if sample.prompt_token_ids is None
                else sample.prompt_token_ids.astype(np.int32, copy=False)
            ),
            response_token_ids=sample.token_ids.astype(np.int32, copy=False),
            behaviour_logprobs=sample.logprobs.astype(np.float32, copy=False),
            token_weight_versions=sample.versions.astype(np.int64, copy=False),
            loss_mask=sample.loss_mask,
            finish_reason=finish_reason_of(sample.finish_reason),
            sampling=sampling,
            engine=engine,
            worker_id=worker_id,
            timings=SampleTimings(
                started_at_unix_s=started_at_unix_s,
                finished_at_unix_s=finished,
                time_to_first_token_s=sample.first_token_s,
                queue_wait_s=queue_wait_s,
            ),
            segments=list(sample.segments),
            tool_calls=list(sample.tool_calls),
            images=list(sample.images),
        )
        for index, sample in enumerate(generated)
    ]
    return Rollout(
        group=group, samples=SampleColumns.from_rows(samples), created_at_unix_s=finished
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
    images: Sequence[bytes] = (),
) -> Rollout:
    """One group's samples, in ``sample_index`` order, with per-token versions and log-probs.
    ``images``: the prompt's images as PNG files (every sample saw them), for a VLM whose
    results carry the expanded prompt ids."""
    generated = [
        _Generated(
            result.token_ids,
            result.logprobs,
            result.weight_versions,
            np.ones(result.num_tokens, dtype=np.uint8),
            result.finish_reason,
            result.timings.first_token_s,
            prompt_token_ids=result.prompt_token_ids,
            images=images,
        )
        for result in results
    ]
    return _assemble(
        group,
        generated,
        params,
        engine=engine,
        worker_id=worker_id,
        started_at_unix_s=started_at_unix_s,
        queue_wait_s=queue_wait_s,
    )


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
    """One group's multi-turn samples: observation tokens masked, turns as segments, each with
    its prompt and the images it showed."""
    generated = [
        _Generated(
            np.asarray(episode.token_ids),
            np.asarray(episode.logprobs),
            np.asarray(episode.versions),
            _trained_tokens(episode),
            str(episode.finish_reason),
            episode.first_token_s,
            episode.segments,
            episode.tool_calls,
            # Each episode's own prompt (its images' placeholders expanded) and every image it
            # showed, as the normalised pixels the engine saw (lossless PNG).
            prompt_token_ids=np.asarray(episode.start.prompt_token_ids),
            images=[encode_png(image) for image in episode.images],
        )
        for episode in episodes
    ]
    return _assemble(
        group,
        generated,
        params,
        engine=engine,
        worker_id=worker_id,
        started_at_unix_s=started_at_unix_s,
        queue_wait_s=None,
    )
