"""``ScoredRollout``: a rollout with rewards (and, for on-policy distillation, teacher
log-probs) attached by the scorer pool."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain
from typing import Annotated, ClassVar

import msgspec
import numpy as np

from dockyard.schemas.arrays import LogProbArray
from dockyard.schemas.base import (
    Count,
    Message,
    NonEmpty,
    WireModel,
    check_fields,
    check_finite_all,
)
from dockyard.schemas.columns import (
    RowColumns,
    check_columns,
    check_total,
    columns_from_given_rows,
    concatenate,
    split,
)
from dockyard.schemas.errors import ReasonCode, WireError
from dockyard.schemas.rollout import Rollout, TokenCount

#: A score flag: a short snake_case identifier (the environments' ``ScoreFlag`` values).
FLAG_PATTERN = r"^[a-z][a-z0-9_]{0,63}\Z"
MAX_SCORE_FLAGS = 32
MAX_SCORE_DETAIL_CHARS = 1000

ScoreFlags = Annotated[
    list[Annotated[str, msgspec.Meta(pattern=FLAG_PATTERN)]],
    msgspec.Meta(max_length=MAX_SCORE_FLAGS),
]
ScoreDetail = Annotated[str, msgspec.Meta(max_length=MAX_SCORE_DETAIL_CHARS)]


def _check_components(components: dict[str, float], what: str) -> None:
    if all(map(math.isfinite, components.values())):
        return
    for name, value in components.items():
        if not math.isfinite(value):
            raise WireError(ReasonCode.NON_FINITE, f"{name!r} is {value}", field=what)


class SampleScore(WireModel, frozen=True, kw_only=True):
    """The score of ``rollout.samples[sample_index]``."""

    FINITE: ClassVar[dict[str, float | None]] = {"reward": None}

    sample_index: Count
    reward: float  # the scalar reward the advantage is computed from
    reward_components: dict[str, float] = msgspec.field(default_factory=dict)
    invalid_action: bool = False
    timed_out: bool = False
    #: log p_teacher per response token (nats), aligned with ``response_token_ids`` (OPD).
    teacher_logprobs: LogProbArray | None = None
    #: Every flag the environment raised (``invalid_action`` and ``timed_out`` are also kept as
    #: booleans); a set: order carries no meaning.
    flags: ScoreFlags = msgspec.field(default_factory=list)
    #: Human-readable explanation from the environment ("" when none).
    detail: ScoreDetail = ""

    def __post_init__(self) -> None:
        check_fields(self)
        _check_components(self.reward_components, "reward_components")


class ScoreColumns(RowColumns, frozen=True, kw_only=True):
    """A group's G scores field by field (entry i: the score of sample i). Reads as a
    sequence of :class:`SampleScore`, built on first access."""

    reward: Annotated[list[float], msgspec.Meta(min_length=1)]
    reward_components: list[dict[str, float]]
    invalid_action: list[bool]
    timed_out: list[bool]
    #: Per sample, how many teacher log-probs it has (its response length) or None; the whole
    #: column is None when no sample has any.
    teacher_lengths: list[TokenCount | None] | None = None
    #: The teacher log-probs of the samples that have them, back to back.
    teacher_logprobs: LogProbArray | None = None
    flags: list[ScoreFlags]
    detail: list[ScoreDetail]

    def __post_init__(self) -> None:
        check_columns(self, len(self.reward), "scores")
        check_finite_all(self.reward, "reward", None)
        every = chain.from_iterable(map(dict.values, self.reward_components))
        if not all(map(math.isfinite, every)):  # one pass in C; name the refused one:
            for index, components in enumerate(self.reward_components):
                _check_components(components, f"reward_components.{index}")
        lengths, teacher = self.teacher_lengths, self.teacher_logprobs
        if (lengths is None) != (teacher is None):
            raise WireError(
                ReasonCode.LENGTH_MISMATCH, "teacher_lengths and teacher_logprobs come together"
            )
        if lengths is not None and teacher is not None:
            present = [length for length in lengths if length is not None]
            if not present:  # would read as "teacher log-probs, none of them": say null
                raise WireError(
                    ReasonCode.INVALID_FIELD,
                    "teacher_lengths names no sample: it is null when no sample has any",
                )
            check_total(teacher, present, "teacher_logprobs", "teacher tokens")

    @classmethod
    def from_rows(cls, rows: Sequence[SampleScore]) -> ScoreColumns:
        """The columns of ``rows`` (checked scores, in ``sample_index`` order 0..G-1)."""
        if any(row.sample_index != index for index, row in enumerate(rows)):
            raise WireError(ReasonCode.INVALID_FIELD, "scores must follow the samples' order")
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
            SampleScore(
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


class ScoredRollout(Message, frozen=True, kw_only=True):
    SCHEMA_NAME: ClassVar[str] = "scored_rollout"
    #: 3.0 writes samples and scores field by field; the first released version (the
    #: pre-release 1.x and 2.x are not read).
    #: 3.1: the rollout's ``ToolCall.error`` (a minor: 3.0 messages still read).
    #: 3.2: the rollout's sample ``images`` (a minor: 3.1 messages still read).
    SCHEMA_VERSION: ClassVar[str] = "3.2"
    FINITE: ClassVar[dict[str, float | None]] = {"scored_at_unix_s": 0.0}

    rollout: Rollout
    #: Built in Python from a list of :class:`SampleScore` as well.
    scores: ScoreColumns
    scorer_id: NonEmpty
    scored_at_unix_s: float = 0.0

    def __post_init__(self) -> None:
        columns_from_given_rows(self, "scores", SampleScore, ScoreColumns)
        check_fields(self)
        samples = self.rollout.samples
        if len(self.scores) != len(samples):
            raise WireError(
                ReasonCode.LENGTH_MISMATCH, f"{len(self.scores)} scores for {len(samples)} samples"
            )
        lengths = self.scores.teacher_lengths
        if lengths is not None:
            for index, (teacher, response) in enumerate(
                zip(lengths, samples.response_lengths, strict=True)
            ):
                if teacher is not None and teacher != response:
                    raise WireError(
                        ReasonCode.LENGTH_MISMATCH,
                        f"sample {index}: {teacher} teacher log-probs for {response} response "
                        "tokens",
                    )

    @property
    def group_id(self) -> str:
        return self.rollout.group.group_id

    def message_id(self) -> str:
        return self.rollout.group.message_id_as(self.SCHEMA_NAME)
