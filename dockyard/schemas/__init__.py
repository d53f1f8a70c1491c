"""Message models and the msgpack+zstd codec: what crosses the broker.

``schemas`` imports nothing of dockyard but its own modules: messages know no transport.
"""

from dockyard.schemas.codec import (
    CODEC_NAME,
    HEADER_CODEC,
    HEADER_MSG_ID,
    HEADER_SCHEMA,
    HEADER_SCHEMA_VERSION,
    EncodedMessage,
    decode,
    encode,
)
from dockyard.schemas.errors import CodecError, ReasonCode
from dockyard.schemas.limits import DEFAULT_LIMITS, DecodeLimits
from dockyard.schemas.messages import (
    INVALID_CALL_ERRORS,
    MESSAGE_TYPES,
    ChatMessage,
    DatasetPosition,
    DeadLetter,
    EngineInfo,
    FinishReason,
    Message,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleScore,
    SampleTimings,
    SamplingParams,
    ScoredRollout,
    Segment,
    ToolCall,
    ToolCallError,
    WeightVersion,
    WireModel,
)

__all__ = [
    "CODEC_NAME",
    "DEFAULT_LIMITS",
    "HEADER_CODEC",
    "HEADER_MSG_ID",
    "HEADER_SCHEMA",
    "HEADER_SCHEMA_VERSION",
    "INVALID_CALL_ERRORS",
    "MESSAGE_TYPES",
    "ChatMessage",
    "CodecError",
    "DatasetPosition",
    "DeadLetter",
    "DecodeLimits",
    "EncodedMessage",
    "EngineInfo",
    "FinishReason",
    "Message",
    "PromptGroup",
    "ReasonCode",
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
    "decode",
    "encode",
]
