"""``DeadLetter``: a message a stage refused, kept with its reason so nothing is lost."""

from __future__ import annotations

import hashlib
from typing import Annotated, ClassVar

import msgspec

from dockyard.schemas.base import Count, Message, NonEmpty, check_fields
from dockyard.schemas.errors import ReasonCode, WireError


class DeadLetter(Message, frozen=True, kw_only=True):
    SCHEMA_NAME: ClassVar[str] = "dead_letter"
    SCHEMA_VERSION: ClassVar[str] = "1.0"
    FINITE: ClassVar[dict[str, float | None]] = {"created_at_unix_s": 0.0}

    original_subject: NonEmpty
    original_headers: dict[str, str] = msgspec.field(default_factory=dict)
    #: The refused bytes verbatim; None when they are kept elsewhere (``original_ref``).
    original_payload: bytes | None = None
    original_ref: str | None = None  # where the bytes are when not inline
    original_message_id: str | None = None  # its Nats-Msg-Id, if any
    original_stream_seq: Count | None = None  # its JetStream sequence
    stage: NonEmpty  # the role that refused it, e.g. "scorer"
    #: A :class:`ReasonCode` value for codec refusals; stages may use their own codes.
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    message: str  # human-readable detail
    delivery_count: Count = 0
    created_at_unix_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self)
        if self.original_payload is None and self.original_ref is None:
            raise WireError(
                ReasonCode.MISSING_FIELD, "original_payload or original_ref is required"
            )

    def message_id(self) -> str:
        # Deterministic so that a stage that dead-letters the same delivery twice (it crashed
        # before acking) publishes one dead letter. An empty id is no id (docs/wire-format.md):
        # ``id=`` alone would give every such letter of a stage the same id, and the broker's
        # duplicate window would keep only the first.
        if self.original_message_id:
            origin = f"id={self.original_message_id}"
        elif self.original_stream_seq is not None:
            origin = f"seq={self.original_subject}#{self.original_stream_seq}"
        else:
            content = self.original_payload or (self.original_ref or "").encode()
            origin = "sha256=" + hashlib.sha256(content).hexdigest()[:32]
        return f"{self.SCHEMA_NAME}:{self.stage}:{origin}"
