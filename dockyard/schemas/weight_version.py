"""``WeightVersion``: the event that announces a new policy version and names its blob."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from dockyard.schemas.base import Count, Message, NonEmpty

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}\Z"


class WeightVersion(Message, frozen=True, kw_only=True):
    SCHEMA_NAME: ClassVar[str] = "weight_version"
    SCHEMA_VERSION: ClassVar[str] = "1.0"
    FINITE: ClassVar[dict[str, float | None]] = {"created_at_unix_s": 0.0}

    version: Count  # monotonic policy version
    step: Count  # trainer optimizer step that produced it
    blob_ref: NonEmpty  # where the bytes are: URI of the blob
    digest: Annotated[str, msgspec.Meta(pattern=DIGEST_PATTERN)]  # sha256 of the blob bytes
    nbytes: Count  # blob size in bytes
    format: NonEmpty = "safetensors"  # container format
    dtype: NonEmpty = "bfloat16"  # parameter dtype in the blob
    delta_base_version: Count | None = None  # the blob is a delta on this version
    created_at_unix_s: float
    producer_id: NonEmpty

    def message_id(self) -> str:
        return f"{self.SCHEMA_NAME}:{self.version}"
