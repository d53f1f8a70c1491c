"""``ScoredRollout``: a rollout with rewards (and, for on-policy distillation, teacher
log-probs) attached by the scorer pool."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dockyard.schemas.arrays import LogProbArray
from dockyard.schemas.base import INT64_MAX, Message, WireModel
from dockyard.schemas.errors import ReasonCode
from dockyard.schemas.rollout import Rollout

#: A score flag: a short snake_case identifier (the environments' ``ScoreFlag`` values).
FLAG_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
MAX_SCORE_FLAGS = 32
MAX_SCORE_DETAIL_CHARS = 1000

# NaN and infinities are refused by pydantic itself (error type ``finite_number``, which the
# codec reports as ``non_finite``): no Python validator runs per score.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


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
    flags: list[Annotated[str, Field(pattern=FLAG_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_SCORE_FLAGS
    )
    #: Since 1.1. Human-readable explanation from the environment ("" when none).
    detail: str = Field("", max_length=MAX_SCORE_DETAIL_CHARS)


class ScoredRollout(Message):
    SCHEMA_NAME: ClassVar[str] = "scored_rollout"
    #: 1.1 added ``SampleScore.flags`` and ``SampleScore.detail`` (both with defaults); 2.0
    #: writes the samples' (and teacher) arrays as columns. 1.x still decodes.
    SCHEMA_VERSION: ClassVar[str] = "2.0"
    ALSO_READS_MAJORS: ClassVar[frozenset[int]] = frozenset({1})

    rollout: Rollout
    scores: list[SampleScore] = Field(min_length=1, description="one per sample, in order")
    scorer_id: str = Field(min_length=1)
    scored_at_unix_s: float = Field(0.0, ge=0.0)

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
        for score, sample in zip(self.scores, samples, strict=True):
            if score.sample_index != sample.sample_index:
                raise PydanticCustomError(
                    ReasonCode.INVALID_FIELD.value, "scores must follow the samples' order"
                )
            teacher = score.teacher_logprobs
            if teacher is not None and teacher.shape[0] != sample.num_response_tokens:
                raise PydanticCustomError(
                    ReasonCode.LENGTH_MISMATCH.value,
                    f"sample {sample.sample_index}: {teacher.shape[0]} teacher log-probs for "
                    f"{sample.num_response_tokens} response tokens",
                )
        return self

    def message_id(self) -> str:
        group = self.rollout.group
        return f"{self.SCHEMA_NAME}:{group.group_id}:{group.attempt}"
