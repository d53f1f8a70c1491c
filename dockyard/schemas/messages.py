"""All message types in one import, and the registry by schema name."""

from __future__ import annotations

from dockyard.schemas.base import Message, WireModel
from dockyard.schemas.dead_letter import DeadLetter
from dockyard.schemas.prompt import ChatMessage, DatasetPosition, PromptGroup
from dockyard.schemas.rollout import (
    INVALID_CALL_ERRORS,
    EngineInfo,
    FinishReason,
    Rollout,
    RolloutSample,
    SampleTimings,
    SamplingParams,
    Segment,
    ToolCall,
    ToolCallError,
)
from dockyard.schemas.scored import SampleScore, ScoredRollout
from dockyard.schemas.weight_version import WeightVersion

#: Every top-level message type by its ``SCHEMA_NAME`` (the ``Dockyard-Schema`` header).
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.SCHEMA_NAME: cls for cls in (PromptGroup, Rollout, ScoredRollout, WeightVersion, DeadLetter)
}

__all__ = [
    "INVALID_CALL_ERRORS",
    "MESSAGE_TYPES",
    "ChatMessage",
    "DatasetPosition",
    "DeadLetter",
    "EngineInfo",
    "FinishReason",
    "Message",
    "PromptGroup",
    "Rollout",
    "RolloutSample",
    "SampleScore",
    "SampleTimings",
    "SamplingParams",
    "ScoredRollout",
    "Segment",
    "ToolCall",
    "ToolCallError",
    "WeightVersion",
    "WireModel",
]
