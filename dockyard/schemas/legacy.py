"""Readers of older major versions: ``rollout`` and ``scored_rollout`` 1.x and 2.x.

Those versions carried one model per sample (and per score); 2.0 moved the samples' arrays into
columns (``@columns``, see ``layout``) but kept per-sample metadata. This build writes 3.0
(everything field by field, ``columns``) and still *reads* 1.x and 2.x, so replay can read old
streams and a fleet can be upgraded reader-first: the codec decodes an older frame with the
class here and :meth:`upgrade` turns it into the current message (the same content).

These classes can also be *encoded* (as 2.0), for a writer that must stay readable by 2.x
readers while a fleet is upgraded, and for tests of the old layouts.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dockyard.schemas.base import Message
from dockyard.schemas.errors import ReasonCode
from dockyard.schemas.prompt import PromptGroup
from dockyard.schemas.rollout import Rollout, RolloutSample
from dockyard.schemas.scored import SampleScore, ScoredRollout


class RolloutV2(Message):
    """``rollout`` 2.0 (and 1.x): the group plus one :class:`RolloutSample` per sample."""

    SCHEMA_NAME: ClassVar[str] = "rollout"
    SCHEMA_VERSION: ClassVar[str] = "2.0"
    ALSO_READS_MAJORS: ClassVar[frozenset[int]] = frozenset({1})

    group: PromptGroup
    samples: list[RolloutSample] = Field(min_length=1)
    created_at_unix_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _samples(self) -> RolloutV2:
        if len(self.samples) != self.group.num_generations:
            raise PydanticCustomError(
                ReasonCode.LENGTH_MISMATCH.value,
                f"{len(self.samples)} samples for num_generations={self.group.num_generations}",
            )
        indices = [sample.sample_index for sample in self.samples]
        if indices != list(range(len(indices))):
            raise PydanticCustomError(
                ReasonCode.INVALID_FIELD.value, "sample_index must be 0..G-1 in order"
            )
        return self

    @classmethod
    def of(cls, rollout: Rollout) -> RolloutV2:
        """``rollout`` in the 2.0 shape (to write it for 2.x readers)."""
        return cls(
            group=rollout.group,
            samples=rollout.samples.rows,
            created_at_unix_s=rollout.created_at_unix_s,
        )

    def upgrade(self) -> Rollout:
        return Rollout(
            group=self.group, samples=self.samples, created_at_unix_s=self.created_at_unix_s
        )

    def message_id(self) -> str:
        return self.group.message_id_as(self.SCHEMA_NAME)


class ScoredRolloutV2(Message):
    """``scored_rollout`` 2.0 (and 1.x): a 2.0 rollout plus one :class:`SampleScore` each."""

    SCHEMA_NAME: ClassVar[str] = "scored_rollout"
    SCHEMA_VERSION: ClassVar[str] = "2.0"
    ALSO_READS_MAJORS: ClassVar[frozenset[int]] = frozenset({1})

    rollout: RolloutV2
    scores: list[SampleScore] = Field(min_length=1)
    scorer_id: str = Field(min_length=1)
    scored_at_unix_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _aligned(self) -> ScoredRolloutV2:
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

    @classmethod
    def of(cls, scored: ScoredRollout) -> ScoredRolloutV2:
        """``scored`` in the 2.0 shape (to write it for 2.x readers)."""
        return cls(
            rollout=RolloutV2.of(scored.rollout),
            scores=scored.scores.rows,
            scorer_id=scored.scorer_id,
            scored_at_unix_s=scored.scored_at_unix_s,
        )

    def upgrade(self) -> ScoredRollout:
        return ScoredRollout(
            rollout=self.rollout.upgrade(),
            scores=self.scores,
            scorer_id=self.scorer_id,
            scored_at_unix_s=self.scored_at_unix_s,
        )

    def message_id(self) -> str:
        return self.rollout.group.message_id_as(self.SCHEMA_NAME)
