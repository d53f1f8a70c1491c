"""All message types in one import, and the registry by schema name."""

from __future__ import annotations

from dockyard.schemas.base import Message, WireModel
from dockyard.schemas.dead_letter import DeadLetter
from dockyard.schemas.legacy import RolloutV2, ScoredRolloutV2
from dockyard.schemas.prompt import ChatMessage, DatasetPosition, PromptGroup
from dockyard.schemas.rollout import (
    EngineInfo,
    FinishReason,
    Rollout,
    RolloutSample,
    SampleTimings,
    SamplingParams,
    Segment,
    ToolCall,
)
from dockyard.schemas.scored import SampleScore, ScoredRollout
from dockyard.schemas.weights import WeightVersion

#: Every top-level message type by its ``SCHEMA_NAME`` (the ``Dockyard-Schema`` header).
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.SCHEMA_NAME: cls for cls in (PromptGroup, Rollout, ScoredRollout, WeightVersion, DeadLetter)
}

#: Older MAJOR versions still decoded, by (schema name, major): the class that reads them.
#: Its ``upgrade()`` gives the current message; it can also be encoded (for old readers).
OLDER_READERS: dict[tuple[str, int], type[RolloutV2] | type[ScoredRolloutV2]] = {
    (cls.SCHEMA_NAME, major): cls
    for cls in (RolloutV2, ScoredRolloutV2)
    for major in cls.readable_majors()
}

__all__ = [
    "MESSAGE_TYPES",
    "OLDER_READERS",
    "ChatMessage",
    "DatasetPosition",
    "DeadLetter",
    "EngineInfo",
    "FinishReason",
    "Message",
    "PromptGroup",
    "Rollout",
    "RolloutSample",
    "RolloutV2",
    "SampleScore",
    "SampleTimings",
    "SamplingParams",
    "ScoredRollout",
    "ScoredRolloutV2",
    "Segment",
    "ToolCall",
    "WeightVersion",
    "WireModel",
]
