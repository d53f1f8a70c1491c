"""Rollout ↔ environment adapters (what a scorer does around ``Environment.score``)."""

from __future__ import annotations

import time

from dockyard.environments.base import GroupScore, SampleInput, ScoreFlag, ScoringGroup
from dockyard.schemas import Rollout, SampleScore, ScoredRollout


def to_scoring_group(rollout: Rollout, tokenizer: object) -> ScoringGroup:
    group = rollout.group
    samples = [
        SampleInput(
            response_text=tokenizer.decode(sample.response_token_ids, skip_special_tokens=False),  # type: ignore[attr-defined]
            response_token_ids=sample.response_token_ids,
            finish_reason=str(sample.finish_reason),
        )
        for sample in rollout.samples
    ]
    return ScoringGroup(
        group_id=group.group_id,
        env_name=group.environment,
        prompt_text=group.prompt_text,
        samples=samples,
        agent_name=group.agent,
        ground_truth=group.ground_truth,
        extra=group.extra,
        prompt_token_ids=group.prompt_token_ids,
    )


def to_scored_rollout(rollout: Rollout, score: GroupScore, scorer_id: str) -> ScoredRollout:
    from dockyard.schemas.scored import MAX_SCORE_DETAIL_CHARS

    def bounded_detail(detail: str) -> str:
        # The wire bounds the human-readable detail; a longer one keeps its start, marked as cut.
        if len(detail) <= MAX_SCORE_DETAIL_CHARS:
            return detail
        return detail[: MAX_SCORE_DETAIL_CHARS - 1] + "…"

    scores = [
        SampleScore(
            sample_index=index,
            reward=sample_score.reward,
            reward_components=dict(sample_score.components),
            invalid_action=ScoreFlag.INVALID_ACTION in sample_score.flags,
            timed_out=ScoreFlag.TIMEOUT in sample_score.flags,
            teacher_logprobs=sample_score.teacher_logprobs,
            # Sorted: the same score always encodes to the same bytes.
            flags=sorted(str(flag) for flag in sample_score.flags),
            detail=bounded_detail(sample_score.detail),
        )
        for index, sample_score in enumerate(score.samples)
    ]
    return ScoredRollout(
        rollout=rollout, scores=scores, scorer_id=scorer_id, scored_at_unix_s=time.time()
    )
