"""``PromptGroup``: one prompt × G generations, as the dispatcher hands it to rollout workers."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar

import msgspec

from dockyard.schemas.arrays import TokenIdArray
from dockyard.schemas.base import (
    IDENTIFIER_PATTERN,
    INT64_MAX,
    Count,
    Message,
    NonEmpty,
    WireModel,
    check_fields,
)
from dockyard.schemas.errors import ReasonCode, WireError


class ChatMessage(WireModel, frozen=True, kw_only=True):
    """One turn of a chat-formatted prompt (before the chat template was applied)."""

    role: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    content: str


class DatasetPosition(WireModel, frozen=True, kw_only=True):
    """Where in the dataset the prompt came from: lets a restarted dispatcher resume exactly."""

    dataset: NonEmpty  # dataset name as configured
    epoch: Count
    index: Count  # position within the epoch's (shuffled) order


#: Bounds on images carried inline (the worker applies the configured, usually tighter, limits).
MAX_INLINE_IMAGES = 64
MAX_INLINE_IMAGE_BYTES = 16 * 1024 * 1024
_JSON_SCALARS = (str, int, float, bool, type(None))


def check_json(value: Any, what: str) -> None:
    """``value`` is a JSON value (nil, bool, int, finite float, str, arrays, maps with str keys):
    msgspec decodes ``Any`` as whatever msgpack holds, bin, ext, NaN and ±∞ included — JSON has
    no NaN, and a JSON writer (``replay export``) would write one as a bare ``NaN``, which no
    JSON reader takes. ``what``: the dotted path of ``value``, named in a refusal."""
    if type(value) is float:
        if not math.isfinite(value):
            raise WireError(ReasonCode.NON_FINITE, f"{what}: {value} is not a JSON number")
        return
    if isinstance(value, _JSON_SCALARS):
        return
    if type(value) is list:
        for index, item in enumerate(value):
            check_json(item, f"{what}.{index}")
        return
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise WireError(ReasonCode.WRONG_TYPE, f"{what}: a map key that is not str")
            check_json(item, f"{what}.{key}")
        return
    raise WireError(ReasonCode.WRONG_TYPE, f"{what}: {type(value).__name__} is not a JSON value")


class PromptGroup(Message, frozen=True, kw_only=True):
    SCHEMA_NAME: ClassVar[str] = "prompt_group"
    #: 1.1 added ``images`` (default: none).
    SCHEMA_VERSION: ClassVar[str] = "1.1"
    FINITE: ClassVar[dict[str, float | None]] = {"created_at_unix_s": 0.0}

    #: Unique per run.
    group_id: Annotated[str, msgspec.Meta(pattern=IDENTIFIER_PATTERN)]
    #: Re-dispatch counter: 0 for the first dispatch; the dispatcher increments it only when it
    #: deliberately issues the same prompt again (e.g. the first attempt was dropped as stale).
    #: Broker redelivery does *not* change it, so a redelivered group keeps its identity.
    attempt: Count = 0
    prompt_token_ids: TokenIdArray
    #: The prompt as text, after the chat template.
    prompt_text: str
    prompt_messages: list[ChatMessage] = msgspec.field(default_factory=list)
    environment: NonEmpty  # the reward environment that scores it
    agent: NonEmpty  # the agent / rollout policy that generates it
    num_generations: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]  # G
    dataset_position: DatasetPosition
    ground_truth: str | None = None  # reference answer for the scorer
    #: Environment-specific data for the scorer (test cases, tool specs, ...): JSON values.
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    #: Since 1.1. Encoded image files (PNG, JPEG, GIF, ...) for the prompt, as the dataset
    #: stored them; the rollout worker gates, bounds and normalises them before any engine.
    images: Annotated[
        list[Annotated[bytes, msgspec.Meta(max_length=MAX_INLINE_IMAGE_BYTES)]],
        msgspec.Meta(max_length=MAX_INLINE_IMAGES),
    ] = msgspec.field(default_factory=list)
    dispatch_weight_version: Count  # policy version when dispatched
    trace_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    created_at_unix_s: float = 0.0  # dispatch time, Unix seconds

    def __post_init__(self) -> None:
        check_fields(self)
        if self.extra:
            check_json(self.extra, "extra")

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
