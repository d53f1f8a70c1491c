"""``WeightVersion``: the event that announces a new policy version and names its blob."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from dockyard.schemas.base import INT64_MAX, Message

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


class WeightVersion(Message):
    SCHEMA_NAME: ClassVar[str] = "weight_version"
    SCHEMA_VERSION: ClassVar[str] = "1.0"

    version: int = Field(ge=0, le=INT64_MAX, description="monotonic policy version")
    step: int = Field(ge=0, le=INT64_MAX, description="trainer optimizer step that produced it")
    blob_ref: str = Field(min_length=1, description="where the bytes are: URI of the blob")
    digest: str = Field(pattern=DIGEST_PATTERN, description="sha256 of the blob bytes")
    nbytes: int = Field(ge=0, le=INT64_MAX, description="blob size in bytes")
    format: str = Field("safetensors", min_length=1, description="container format")
    dtype: str = Field("bfloat16", min_length=1, description="parameter dtype in the blob")
    delta_base_version: int | None = Field(
        None, ge=0, le=INT64_MAX, description="blob is a delta on this"
    )
    created_at_unix_s: float = Field(ge=0.0, allow_inf_nan=False)
    producer_id: str = Field(min_length=1)

    def message_id(self) -> str:
        return f"{self.SCHEMA_NAME}:{self.version}"
