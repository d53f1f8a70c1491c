"""``PromptGroup``: one prompt × G generations, as the dispatcher hands it to rollout workers."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, JsonValue

from dockyard.schemas.arrays import TokenIdArray
from dockyard.schemas.base import IDENTIFIER_PATTERN, INT64_MAX, Message, WireModel


class ChatMessage(WireModel):
    """One turn of a chat-formatted prompt (before the chat template was applied)."""

    role: str = Field(min_length=1, max_length=64)
    content: str


class DatasetPosition(WireModel):
    """Where in the dataset the prompt came from: lets a restarted dispatcher resume exactly."""

    dataset: str = Field(min_length=1, description="dataset name as configured")
    epoch: int = Field(ge=0, le=INT64_MAX)
    index: int = Field(
        ge=0, le=INT64_MAX, description="position within the epoch's (shuffled) order"
    )


#: Bounds on images carried inline (the worker applies the configured, usually tighter, limits).
MAX_INLINE_IMAGES = 64
MAX_INLINE_IMAGE_BYTES = 16 * 1024 * 1024


class PromptGroup(Message):
    SCHEMA_NAME: ClassVar[str] = "prompt_group"
    #: 1.1 added ``images`` (default: none).
    SCHEMA_VERSION: ClassVar[str] = "1.1"

    group_id: str = Field(pattern=IDENTIFIER_PATTERN, description="unique per run")
    #: Re-dispatch counter: 0 for the first dispatch; the dispatcher increments it only when it
    #: deliberately issues the same prompt again (e.g. the first attempt was dropped as stale).
    #: Broker redelivery does *not* change it, so a redelivered group keeps its identity.
    attempt: int = Field(0, ge=0, le=INT64_MAX)
    prompt_token_ids: TokenIdArray
    prompt_text: str = Field(description="the prompt as text, after the chat template")
    prompt_messages: list[ChatMessage] = Field(default_factory=list)
    environment: str = Field(min_length=1, description="reward environment that scores it")
    agent: str = Field(min_length=1, description="agent/rollout policy that generates it")
    num_generations: int = Field(
        ge=1, le=INT64_MAX, description="G: samples to generate for this prompt"
    )
    dataset_position: DatasetPosition
    ground_truth: str | None = Field(None, description="reference answer for the scorer")
    #: Environment-specific data for the scorer (test cases, tool specs, ...): JSON values.
    extra: dict[str, JsonValue] = Field(default_factory=dict)
    #: Since 1.1. Encoded image files (PNG, JPEG, GIF, ...) for the prompt, as the dataset
    #: stored them; the rollout worker gates, bounds and normalises them before any engine.
    images: list[Annotated[bytes, Field(max_length=MAX_INLINE_IMAGE_BYTES)]] = Field(
        default_factory=list, max_length=MAX_INLINE_IMAGES
    )
    dispatch_weight_version: int = Field(
        ge=0, le=INT64_MAX, description="policy version when dispatched"
    )
    trace_id: str = Field(min_length=1, max_length=128)
    created_at_unix_s: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="dispatch time, Unix seconds"
    )

    def message_id(self) -> str:
        return self.message_id_as(self.SCHEMA_NAME)

    def message_id_as(self, schema_name: str) -> str:
        """The message id of this group's ``schema_name`` message (its rollout, its scored
        rollout): one per group and attempt, whoever produced it."""
        return f"{schema_name}:{self.group_id}:{self.attempt}"


def group_id_of(message_id: str, schema_names: tuple[str, ...]) -> str | None:
    """The group id inside a message id that :meth:`PromptGroup.message_id_as` wrote for one of
    ``schema_names`` (group ids may contain colons); None for any other message id."""
    schema, _, rest = message_id.partition(":")
    group_id, _, attempt = rest.rpartition(":")
    if schema not in schema_names or not group_id or not attempt.isdigit():
        return None
    return group_id
