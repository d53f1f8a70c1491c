"""Rollout ↔ environment adapters (what a scorer does around ``Environment.score``)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from dockyard.environments.base import (
    GroupScore,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    ToolCallRecord,
    final_turn,
)
from dockyard.environments.tools.calls import ToolCallFormat, parse_tool_calls, thinking_problem
from dockyard.schemas import Rollout, RolloutSample, SampleScore, ScoredRollout
from dockyard.schemas.scored import ScoreColumns


@dataclass(frozen=True)
class OutputChecks:
    """Flags a scorer raises from a sample's own turns, whatever its environment says: the
    ones ``grpo.invalid_tool_call_advantage`` and ``grpo.malformed_thinking_advantage`` act on.

    ``tool_call_format``: set with ``grpo.structured_tool_use.enabled``; a turn holding a call
    that cannot be read, or a call the episode recorded as invalid (``ToolCall.error``: an
    unknown tool, arguments the tool refused, past the calls allowed per turn), is flagged
    ``invalid_tool_call``. ``thinking``: a turn whose
    ``<think>`` block is broken (:func:`thinking_problem`) is flagged ``malformed_thinking``.
    """

    tool_call_format: ToolCallFormat | None = None
    thinking: bool = False

    @property
    def active(self) -> bool:
        return self.tool_call_format is not None or self.thinking


def turn_texts(sample: RolloutSample, tokenizer: object) -> list[str]:
    """The model's turns as text: its assistant segments, or the whole response (one turn)."""
    tokens = sample.response_token_ids
    spans = [(s.start, s.end) for s in sample.segments if s.role == "assistant"]
    if not sample.segments:
        spans = [(0, len(tokens))]
    return [
        tokenizer.decode(tokens[start:end], skip_special_tokens=True)  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in consumers)
        for start, end in spans
    ]


def output_flags(
    sample: RolloutSample, tokenizer: object, checks: OutputChecks
) -> frozenset[ScoreFlag]:
    flags: set[ScoreFlag] = set()
    if checks.tool_call_format is not None and any(call.invalid for call in sample.tool_calls):
        flags.add(ScoreFlag.INVALID_TOOL_CALL)
    for text in turn_texts(sample, tokenizer):
        fmt = checks.tool_call_format
        if fmt is not None and parse_tool_calls(text, fmt).malformed:
            flags.add(ScoreFlag.INVALID_TOOL_CALL)
        if checks.thinking and thinking_problem(text) is not None:
            flags.add(ScoreFlag.MALFORMED_THINKING)
    return frozenset(flags)


def with_output_flags(
    score: GroupScore, rollout: Rollout, tokenizer: object, checks: OutputChecks
) -> GroupScore:
    """``score`` with each sample's output flags added (unchanged when no check is on)."""
    if not checks.active:
        return score
    samples = [
        dataclasses.replace(
            sample_score,
            flags=sample_score.flags | output_flags(sample, tokenizer, checks),
        )
        for sample_score, sample in zip(score.samples, rollout.samples, strict=True)
    ]
    return GroupScore(group_id=score.group_id, samples=samples)


def _final_turn_text(sample: RolloutSample, tokenizer: object) -> str | None:
    turn = final_turn(sample.segments)
    if turn is None:
        return None
    text: str = tokenizer.decode(sample.response_token_ids[turn], skip_special_tokens=False)  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in consumers)
    return text


def to_scoring_group(rollout: Rollout, tokenizer: object) -> ScoringGroup:
    group = rollout.group
    samples = [
        SampleInput(
            response_text=tokenizer.decode(sample.response_token_ids, skip_special_tokens=False),  # type: ignore[attr-defined]  # tokenizer: object here (no transformers types in consumers)
            response_token_ids=sample.response_token_ids,
            finish_reason=str(sample.finish_reason),
            # An episode has segments (one per turn and observation); a single turn has none.
            tool_calls=[
                ToolCallRecord(call.name, call.arguments_json, call.result, call.error)
                for call in sample.tool_calls
            ]
            if sample.segments
            else None,
            final_turn_text=_final_turn_text(sample, tokenizer),
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
        rollout=rollout,
        scores=ScoreColumns.from_rows(scores),
        scorer_id=scorer_id,
        scored_at_unix_s=time.time(),
    )
