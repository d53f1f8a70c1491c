"""``DeadLetter``: a message a stage refused, kept with its reason so nothing is lost."""

from __future__ import annotations

import hashlib
from typing import ClassVar

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dockyard.schemas.base import INT64_MAX, Message
from dockyard.schemas.errors import ReasonCode


class DeadLetter(Message):
    SCHEMA_NAME: ClassVar[str] = "dead_letter"
    SCHEMA_VERSION: ClassVar[str] = "1.0"

    original_subject: str = Field(min_length=1)
    original_headers: dict[str, str] = Field(default_factory=dict)
    #: The refused bytes verbatim; None when they are kept elsewhere (``original_ref``).
    original_payload: bytes | None = None
    original_ref: str | None = Field(None, description="where the bytes are when not inline")
    original_message_id: str | None = Field(None, description="its Nats-Msg-Id, if any")
    original_stream_seq: int | None = Field(
        None, ge=0, le=INT64_MAX, description="its JetStream sequence"
    )
    stage: str = Field(min_length=1, description="the role that refused it, e.g. 'scorer'")
    #: A :class:`ReasonCode` value for codec refusals; stages may use their own codes.
    reason: str = Field(min_length=1, max_length=64)
    message: str = Field(description="human-readable detail")
    delivery_count: int = Field(0, ge=0, le=INT64_MAX)
    created_at_unix_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _has_original(self) -> DeadLetter:
        if self.original_payload is None and self.original_ref is None:
            raise PydanticCustomError(
                ReasonCode.MISSING_FIELD.value, "original_payload or original_ref is required"
            )
        return self

    def message_id(self) -> str:
        # Deterministic so that a stage that dead-letters the same delivery twice (it crashed
        # before acking) publishes one dead letter.
        if self.original_message_id is not None:
            origin = f"id={self.original_message_id}"
        elif self.original_stream_seq is not None:
            origin = f"seq={self.original_subject}#{self.original_stream_seq}"
        else:
            content = self.original_payload or (self.original_ref or "").encode()
            origin = "sha256=" + hashlib.sha256(content).hexdigest()[:32]
        return f"{self.SCHEMA_NAME}:{self.stage}:{origin}"
