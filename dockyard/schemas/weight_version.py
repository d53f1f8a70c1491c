"""``WeightVersion``: the event that announces a new policy version and names its blob."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from dockyard.schemas.base import Count, Message, NonEmpty, check_fields
from dockyard.schemas.errors import ReasonCode, WireError

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}\Z"
#: ``format`` of an event whose blob is a sparse patch on ``delta_base_version``
#: (docs/wire-format.md, "Weight patches").
PATCH_FORMAT = "dockyard-sparse-patch"
#: ``format`` of a full snapshot.
SNAPSHOT_FORMAT = "safetensors"


class WeightVersion(Message, frozen=True, kw_only=True):
    SCHEMA_NAME: ClassVar[str] = "weight_version"
    SCHEMA_VERSION: ClassVar[str] = "1.0"
    FINITE: ClassVar[dict[str, float | None]] = {"created_at_unix_s": 0.0}

    version: Count  # monotonic policy version
    step: Count  # trainer optimizer step that produced it
    blob_ref: NonEmpty  # where the bytes are: URI of the blob
    digest: Annotated[str, msgspec.Meta(pattern=DIGEST_PATTERN)]  # sha256 of the blob bytes
    nbytes: Count  # blob size in bytes
    format: NonEmpty = SNAPSHOT_FORMAT  # container format
    dtype: NonEmpty = "bfloat16"  # parameter dtype in the blob
    #: The blob is a patch on this version: set exactly when ``format`` is the patch format.
    delta_base_version: Count | None = None
    created_at_unix_s: float
    producer_id: NonEmpty

    def __post_init__(self) -> None:
        check_fields(self)
        # A patch without its base cannot be applied, and a base on anything else would be
        # read by no one: either is a producer's mistake, refused rather than guessed at.
        if (self.format == PATCH_FORMAT) != (self.delta_base_version is not None):
            said = "without" if self.delta_base_version is None else "with"
            raise WireError(
                ReasonCode.INVALID_FIELD,
                f"a {self.format!r} event {said} a delta_base_version: it is set exactly when "
                f"the format is {PATCH_FORMAT!r}",
                field="delta_base_version",
            )

    def message_id(self) -> str:
        return f"{self.SCHEMA_NAME}:{self.version}"
