"""A blob's manifest: what a reader needs to fetch and check it, read strictly.

Both stores write one JSON manifest per blob (the filesystem store beside the blob, the
JetStream store after the chunks). A manifest is read back by other processes and sites, so a
damaged or foreign one is refused with :class:`BlobManifestError` naming where it was found —
never a ``KeyError`` from deep inside a refit.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from dockyard.broker.plane import DataPlaneError
from dockyard.broker.weight_blobs.base import DIGEST_PREFIX, BlobRef

_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_Digest = Annotated[str, msgspec.Meta(pattern=f"^{DIGEST_PREFIX}[0-9a-f]{{64}}$")]


class BlobManifestError(DataPlaneError):
    """A manifest that is not JSON, lacks a field, has one of the wrong type or names another
    blob than the one it is stored for."""


class BlobManifest(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    version: _NonNegative
    digest: _Digest
    nbytes: _NonNegative
    created_at_unix_s: float
    #: JetStream store only, both or neither: how many chunks of at most ``chunk_size`` bytes
    #: hold the blob. UNSET (absent), not None: ``null`` is not an integer, and is refused.
    chunks: _NonNegative | msgspec.UnsetType = msgspec.UNSET
    chunk_size: Annotated[int, msgspec.Meta(ge=1)] | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        # Runs on decode too (msgspec reports it as a ValidationError): half a chunk layout is
        # a damaged manifest, not one of the two layouts the stores write.
        if (self.chunks is msgspec.UNSET) != (self.chunk_size is msgspec.UNSET):
            raise ValueError("`chunks` and `chunk_size` come together or not at all")

    def ref(self, uri: str) -> BlobRef:
        return BlobRef(self.version, self.digest, self.nbytes, uri, self.created_at_unix_s)


_decoder = msgspec.json.Decoder(BlobManifest)


def encode_manifest(manifest: BlobManifest) -> bytes:
    return msgspec.json.encode(manifest)


def decode_manifest(data: bytes | str, *, hex_digest: str, where: str) -> BlobManifest:
    """The manifest stored for blob ``hex_digest`` at ``where`` (a path or subject)."""
    try:
        manifest = _decoder.decode(data)
    except msgspec.DecodeError as error:
        raise BlobManifestError(f"blob manifest {where} is unreadable: {error}") from None
    if manifest.digest != DIGEST_PREFIX + hex_digest:
        raise BlobManifestError(
            f"blob manifest {where} names {manifest.digest}, not the blob it is stored for "
            f"({DIGEST_PREFIX}{hex_digest})"
        )
    return manifest
