"""Filesystem and HTTP transports: a shared directory, optionally served over HTTP.

The writer (trainer) puts ``<hex>.blob`` and ``<hex>.json`` (the manifest) into the directory,
each written to a temporary name and renamed, so a reader never sees half a blob. Readers either
open the directory (shared filesystem) or GET ``<base_url>/<hex>.blob`` with httpx, streaming and
hashing as the bytes arrive.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

from dockyard.broker.weight_blobs.base import (
    DIGEST_PREFIX,
    HASH_BLOCK,
    BlobNotFound,
    BlobRef,
    BlobSource,
    WeightBlobStore,
    check_digest,
    digest_of_bytes,
    digest_of_file,
    new_ref,
    source_to_bytes,
)
from dockyard.broker.weight_blobs.leases import BlobLeases
from dockyard.broker.weight_blobs.manifest import BlobManifest, decode_manifest, encode_manifest


class FilesystemBlobStore(WeightBlobStore):
    def __init__(
        self,
        directory: Path,
        *,
        keep_last: int,
        grace_s: float,
        leases: BlobLeases | None = None,
    ) -> None:
        super().__init__(keep_last=keep_last, grace_s=grace_s, leases=leases)
        self.directory = directory

    def _blob_path(self, hex_digest: str) -> Path:
        return self.directory / f"{hex_digest}.blob"

    def _manifest_path(self, hex_digest: str) -> Path:
        return self.directory / f"{hex_digest}.json"

    def uri_for(self, hex_digest: str) -> str:
        return self._blob_path(hex_digest).resolve().as_uri()

    async def put(self, version: int, source: BlobSource) -> BlobRef:
        return await asyncio.to_thread(self._put_sync, version, source)

    def _put_sync(self, version: int, source: BlobSource) -> BlobRef:
        self.directory.mkdir(parents=True, exist_ok=True)
        if isinstance(source, Path):
            digest = digest_of_file(source)
            nbytes = source.stat().st_size
            data: bytes | None = None
        else:
            data = source_to_bytes(source)
            digest = digest_of_bytes(data)
            nbytes = len(data)
        hex_digest = digest.removeprefix(DIGEST_PREFIX)
        ref = new_ref(version, digest, nbytes, self.uri_for(hex_digest))
        target = self._blob_path(hex_digest)
        if not target.exists():
            tmp = target.with_name(f".{target.name}.{os.getpid()}.partial")
            if data is None:
                assert isinstance(source, Path)
                tmp.write_bytes(source.read_bytes())
            else:
                tmp.write_bytes(data)
            tmp.replace(target)
        manifest = BlobManifest(
            version=ref.version,
            digest=ref.digest,
            nbytes=ref.nbytes,
            created_at_unix_s=ref.created_at_unix_s,
        )
        manifest_tmp = self._manifest_path(hex_digest).with_suffix(".json.partial")
        manifest_tmp.write_bytes(encode_manifest(manifest))
        manifest_tmp.replace(self._manifest_path(hex_digest))
        return ref

    async def _read_bytes(self, ref: BlobRef) -> bytes:
        path = self._blob_path(ref.hex)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {ref.digest} in {self.directory}") from None
        check_digest(ref.digest, digest_of_bytes(data), str(path))
        return data

    async def get_path(self, ref: BlobRef) -> Path:
        """The blob in place (no copy), after verifying it. The caller reads it in place, so
        it must not rely on it after the version is superseded and the grace has passed."""
        async with self._lease(ref):
            path = self._blob_path(ref.hex)
            if not path.exists():
                raise BlobNotFound(f"no blob {ref.digest} in {self.directory}")
            check_digest(ref.digest, await asyncio.to_thread(digest_of_file, path), str(path))
            return path

    async def refs(self) -> list[BlobRef]:
        out = []
        for path in self.directory.glob("*.json"):
            manifest = decode_manifest(path.read_bytes(), hex_digest=path.stem, where=str(path))
            out.append(manifest.ref(self.uri_for(path.stem)))
        return sorted(out, key=lambda r: r.version)

    async def delete(self, ref: BlobRef) -> None:
        self._manifest_path(ref.hex).unlink(missing_ok=True)
        self._blob_path(ref.hex).unlink(missing_ok=True)


class HttpBlobStore(FilesystemBlobStore):
    """Writes go to the served directory; reads GET ``<base_url>/<hex>.blob`` with httpx."""

    def __init__(
        self,
        base_url: str,
        directory: Path | None,
        *,
        keep_last: int,
        grace_s: float,
        timeout_s: float,
        leases: BlobLeases | None = None,
    ) -> None:
        super().__init__(
            directory or Path("."), keep_last=keep_last, grace_s=grace_s, leases=leases
        )
        self.base_url = base_url.rstrip("/")
        self._writable = directory is not None
        self.timeout_s = timeout_s

    def uri_for(self, hex_digest: str) -> str:
        return f"{self.base_url}/{hex_digest}.blob"

    async def put(self, version: int, source: BlobSource) -> BlobRef:
        if not self._writable:
            raise PermissionError(
                "weight_transport.kind=http: this process has no data_plane.weight_transport.path "
                "to write blobs into (only the trainer needs one)"
            )
        return await super().put(version, source)

    async def _read_bytes(self, ref: BlobRef) -> bytes:
        import httpx

        url = self.uri_for(ref.hex)
        hasher = hashlib.sha256()
        parts: list[bytes] = []
        async with (
            httpx.AsyncClient(timeout=self.timeout_s) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code == 404:
                raise BlobNotFound(f"no blob {ref.digest} at {url}")
            response.raise_for_status()
            async for block in response.aiter_bytes(HASH_BLOCK):
                hasher.update(block)
                parts.append(block)
        check_digest(ref.digest, DIGEST_PREFIX + hasher.hexdigest(), url)
        return b"".join(parts)

    async def refs(self) -> list[BlobRef]:
        return await super().refs() if self._writable else []
