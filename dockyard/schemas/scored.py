"""``ScoredRollout``: a rollout with rewards (and, for on-policy distillation, teacher
log-probs) attached by the scorer pool."""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dockyard.schemas.arrays import LogProbArray
from dockyard.schemas.base import INT64_MAX, Message, WireModel
from dockyard.schemas.errors import ReasonCode
from dockyard.schemas.rollout import Rollout


class SampleScore(WireModel):
    """The score of ``rollout.samples[sample_index]``."""

    sample_index: int = Field(ge=0, le=INT64_MAX)
    reward: float = Field(description="the scalar reward the advantage is computed from")
    reward_components: dict[str, float] = Field(default_factory=dict)
    invalid_action: bool = False
    timed_out: bool = False
    #: log p_teacher per response token (nats), aligned with ``response_token_ids`` (OPD).
    teacher_logprobs: LogProbArray | None = None

    @model_validator(mode="after")
    def _finite(self) -> SampleScore:
        values = [self.reward, *self.reward_components.values()]
        if not all(math.isfinite(value) for value in values):
            raise PydanticCustomError(ReasonCode.NON_FINITE.value, "reward is not finite")
        return self


class ScoredRollout(Message):
    SCHEMA_NAME: ClassVar[str] = "scored_rollout"
    SCHEMA_VERSION: ClassVar[str] = "1.0"

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
