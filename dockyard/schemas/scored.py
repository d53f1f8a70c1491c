"""``ScoredRollout``: a rollout with rewards (and, for on-policy distillation, teacher
log-probs) attached by the scorer pool."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from dockyard.schemas.arrays import LogProbArray
from dockyard.schemas.base import INT64_MAX, Message, WireModel, frame_inert
from dockyard.schemas.columns import (
    RowColumns,
    check_counts,
    check_total,
    concatenate,
    rows_to_columns,
    split,
)
from dockyard.schemas.errors import ReasonCode
from dockyard.schemas.rollout import Rollout, TokenCount

#: A score flag: a short snake_case identifier (the environments' ``ScoreFlag`` values).
FLAG_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
MAX_SCORE_FLAGS = 32
MAX_SCORE_DETAIL_CHARS = 1000

# NaN and infinities are refused by pydantic itself (error type ``finite_number``, which the
# codec reports as ``non_finite``): no Python validator runs per score.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
ScoreFlags = Annotated[
    list[Annotated[str, Field(pattern=FLAG_PATTERN)]], Field(max_length=MAX_SCORE_FLAGS)
]
ScoreDetail = Annotated[str, Field(max_length=MAX_SCORE_DETAIL_CHARS)]


class SampleScore(WireModel):
    """The score of ``rollout.samples[sample_index]``."""

    sample_index: int = Field(ge=0, le=INT64_MAX)
    reward: FiniteFloat = Field(description="the scalar reward the advantage is computed from")
    reward_components: dict[str, FiniteFloat] = Field(default_factory=dict)
    invalid_action: bool = False
    timed_out: bool = False
    #: log p_teacher per response token (nats), aligned with ``response_token_ids`` (OPD).
    teacher_logprobs: LogProbArray | None = None
    #: Since 1.1. Every flag the environment raised (``invalid_action`` and ``timed_out`` are
    #: also kept as booleans for 1.0 readers); a set: order carries no meaning.
    flags: ScoreFlags = Field(default_factory=list)
    #: Since 1.1. Human-readable explanation from the environment ("" when none).
    detail: ScoreDetail = ""


class ScoreColumns(RowColumns):
    """A group's G scores field by field (entry i: the score of sample i). Reads as a
    sequence of :class:`SampleScore`, built on first access."""

    reward: list[FiniteFloat] = Field(min_length=1)
    reward_components: list[dict[str, FiniteFloat]]
    invalid_action: list[bool]
    timed_out: list[bool]
    #: Per sample, how many teacher log-probs it has (its response length) or None; the whole
    #: column is None when no sample has any.
    teacher_lengths: list[TokenCount | None] | None = None
    #: The teacher log-probs of the samples that have them, back to back.
    teacher_logprobs: LogProbArray | None = None
    flags: list[ScoreFlags]
    detail: list[ScoreDetail]

    @model_validator(mode="after")
    def _consistent(self) -> ScoreColumns:
        check_counts(self, len(self.reward), "scores")
        lengths, teacher = self.teacher_lengths, self.teacher_logprobs
        if (lengths is None) != (teacher is None):
            raise PydanticCustomError(
                ReasonCode.LENGTH_MISMATCH.value,
                "teacher_lengths and teacher_logprobs come together",
            )
        if lengths is not None and teacher is not None:
            present = [length for length in lengths if length is not None]
            if not present:  # would read as "teacher log-probs, none of them": say null
                raise PydanticCustomError(
                    ReasonCode.INVALID_FIELD.value,
                    "teacher_lengths names no sample: it is null when no sample has any",
                )
            check_total(teacher, present, "teacher_logprobs", "teacher tokens")
        return self

    @classmethod
    def from_rows(cls, rows: Sequence[SampleScore]) -> ScoreColumns:
        """The columns of ``rows`` (validated scores, in ``sample_index`` order 0..G-1)."""
        if any(row.sample_index != index for index, row in enumerate(rows)):
            raise PydanticCustomError(
                ReasonCode.INVALID_FIELD.value, "scores must follow the samples' order"
            )
        teachers = [row.teacher_logprobs for row in rows]
        present = [teacher for teacher in teachers if teacher is not None]
        columns = cls(
            reward=[row.reward for row in rows],
            reward_components=[row.reward_components for row in rows],
            invalid_action=[row.invalid_action for row in rows],
            timed_out=[row.timed_out for row in rows],
            teacher_lengths=(
                [None if teacher is None else teacher.shape[0] for teacher in teachers]
                if present
                else None
            ),
            teacher_logprobs=concatenate(present) if present else None,
            flags=[row.flags for row in rows],
            detail=[row.detail for row in rows],
        )
        columns.keep_rows(rows)
        return columns

    @cached_property
    def rows(self) -> list[SampleScore]:
        """Every score as a :class:`SampleScore`, built once."""
        return self._build_rows()

    def teacher_runs(self) -> list[np.ndarray | None]:
        """Per sample, its teacher log-probs (a view) or None."""
        runs: list[np.ndarray | None] = [None] * len(self.reward)
        lengths, teacher = self.teacher_lengths, self.teacher_logprobs
        if lengths is not None and teacher is not None:
            present = [(i, length) for i, length in enumerate(lengths) if length is not None]
            cut = split(teacher, [length for _, length in present])
            for (index, _), run in zip(present, cut, strict=True):
                runs[index] = run
        return runs

    def _build_rows(self) -> list[SampleScore]:
        teachers = self.teacher_runs()
        return [
            SampleScore.model_construct(
                sample_index=index,
                reward=self.reward[index],
                reward_components=self.reward_components[index],
                invalid_action=self.invalid_action[index],
                timed_out=self.timed_out[index],
                teacher_logprobs=teachers[index],
                flags=self.flags[index],
                detail=self.detail[index],
            )
            for index in range(len(self.reward))
        ]

    def __len__(self) -> int:
        return len(self.reward)


class ScoredRollout(Message):
    SCHEMA_NAME: ClassVar[str] = "scored_rollout"
    #: 3.0 writes samples and scores field by field; the first released version (the
    #: pre-release 1.x and 2.x are not read).
    SCHEMA_VERSION: ClassVar[str] = "3.0"

    rollout: Rollout
    scores: ScoreColumns
    scorer_id: str = Field(min_length=1)
    scored_at_unix_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)

    @field_validator("scores", mode="before")
    @classmethod
    @frame_inert
    def _scores_from_rows(cls, value: Any, info: ValidationInfo) -> Any:
        return rows_to_columns(value, info, SampleScore, ScoreColumns.from_rows, "scores")

    @property
    def group_id(self) -> str:
        return self.rollout.group.group_id

    @model_validator(mode="after")
    def _aligned(self) -> ScoredRollout:
        samples = self.rollout.samples
        if len(self.scores) != len(samples):
            raise PydanticCustomError(
                ReasonCode.LENGTH_MISMATCH.value,
                f"{len(self.scores)} scores for {len(samples)} samples",
            )
        lengths = self.scores.teacher_lengths
        if lengths is not None:
            for index, (teacher, response) in enumerate(
                zip(lengths, samples.response_lengths, strict=True)
            ):
                if teacher is not None and teacher != response:
                    raise PydanticCustomError(
                        ReasonCode.LENGTH_MISMATCH.value,
                        f"sample {index}: {teacher} teacher log-probs for {response} response "
                        "tokens",
                    )
        return self

    def message_id(self) -> str:
        return self.rollout.group.message_id_as(self.SCHEMA_NAME)
