"""A blob's manifest is read strictly (docs/wire-format.md, "Weight blobs"): every field of its
type, no other field, `chunks` and `chunk_size` together or not at all."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dockyard.broker.weight_blobs.manifest import (
    BlobManifest,
    BlobManifestError,
    decode_manifest,
    encode_manifest,
)

HEX = "ab" * 32
WHERE = "run1.blobs.<hex>.meta"


def _manifest(**fields: Any) -> bytes:
    body = {"version": 3, "digest": f"sha256:{HEX}", "nbytes": 10, "created_at_unix_s": 1.0}
    body.update(fields)
    return json.dumps(body).encode()


def test_a_jetstream_manifest_and_a_directory_manifest_are_read() -> None:
    chunked = decode_manifest(_manifest(chunks=3, chunk_size=4), hex_digest=HEX, where=WHERE)
    assert (chunked.chunks, chunked.chunk_size) == (3, 4)
    plain = decode_manifest(_manifest(), hex_digest=HEX, where=WHERE)
    assert plain.nbytes == 10


@pytest.mark.parametrize(
    "fields",
    [
        {"chunks": 3},
        {"chunk_size": 4},
    ],
    ids=["chunks-without-chunk-size", "chunk-size-without-chunks"],
)
def test_chunks_and_chunk_size_come_together(fields: dict[str, Any]) -> None:
    with pytest.raises(BlobManifestError, match="chunk") as refused:
        decode_manifest(_manifest(**fields), hex_digest=HEX, where=WHERE)
    assert WHERE in str(refused.value)


@pytest.mark.parametrize("field", ["version", "nbytes", "chunks", "chunk_size"])
def test_null_is_not_an_integer(field: str) -> None:
    # The document calls these integers; `null` is not one (an absent optional field is absent).
    fields: dict[str, Any] = {"chunks": 3, "chunk_size": 4, field: None}
    with pytest.raises(BlobManifestError, match=field) as refused:
        decode_manifest(_manifest(**fields), hex_digest=HEX, where=WHERE)
    assert WHERE in str(refused.value)


def test_what_a_store_writes_reads_back() -> None:
    for manifest in (
        BlobManifest(version=1, digest=f"sha256:{HEX}", nbytes=9, created_at_unix_s=2.0),
        BlobManifest(
            version=1,
            digest=f"sha256:{HEX}",
            nbytes=9,
            created_at_unix_s=2.0,
            chunks=3,
            chunk_size=4,
        ),
    ):
        data = encode_manifest(manifest)
        assert b"null" not in data
        assert decode_manifest(data, hex_digest=HEX, where=WHERE) == manifest
