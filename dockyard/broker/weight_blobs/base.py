"""The :class:`WeightBlobStore` interface, blob references and the retention rule."""

from __future__ import annotations

import abc
import contextlib
import hashlib
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dockyard.broker.plane import DataPlaneError
from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    import torch

    from dockyard.broker.weight_blobs.leases import BlobLeases

log = get_logger(__name__)

BlobSource = bytes | bytearray | memoryview | Path | Mapping[str, "torch.Tensor"]
DIGEST_PREFIX = "sha256:"
HASH_BLOCK = 8 * 1024 * 1024


class BlobNotFound(DataPlaneError, KeyError):
    """No blob with that digest (never stored, or pruned)."""


class BlobDigestMismatch(DataPlaneError):
    """The bytes read do not hash to the digest that names them: refuse to load them."""


@dataclass(frozen=True)
class BlobRef:
    """What a ``WeightVersion`` event carries about its blob."""

    version: int
    digest: str  # "sha256:<64 hex>"
    nbytes: int
    uri: str
    created_at_unix_s: float

    @property
    def hex(self) -> str:
        return self.digest.removeprefix(DIGEST_PREFIX)


def digest_of_bytes(data: bytes | bytearray | memoryview) -> str:
    return DIGEST_PREFIX + hashlib.sha256(data).hexdigest()


def digest_of_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(HASH_BLOCK):
            hasher.update(block)
    return DIGEST_PREFIX + hasher.hexdigest()


def tensors_to_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """safetensors, the format every engine's refit path loads.

    Takes a live state dict as it is (the bytes are the only copy made): safetensors refuses
    tensors that share storage, so only those (tied embeddings, views) are cloned, and every
    name is kept because engines load by name.
    """
    from safetensors.torch import save

    storages: set[int] = set()
    prepared = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach()
        storage = tensor.untyped_storage().data_ptr()
        if storage in storages:
            tensor = tensor.clone()
        else:
            storages.add(storage)
        prepared[name] = tensor.contiguous().cpu()
    return save(prepared)


def source_to_bytes(source: BlobSource) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source)
    if isinstance(source, Path):
        return source.read_bytes()
    return tensors_to_bytes(source)


def check_digest(expected: str, actual: str, where: str) -> None:
    if expected != actual:
        raise BlobDigestMismatch(
            f"blob {where}: bytes hash to {actual}, but the blob is named {expected}; "
            f"refusing to load it"
        )


def prunable(
    refs: list[BlobRef],
    keep_last: int,
    grace_s: float,
    now: float,
    needed: Collection[str] = (),
) -> list[BlobRef]:
    """Versions the age rule lets go: beyond the newest ``keep_last``, superseded long enough,
    and not ``needed`` (digests of the current version chain: its snapshot and patches).

    A version stays for ``grace_s`` after the version that replaced it was put, so a worker that
    started fetching it just before the new event can finish even without a lease; a version
    with a live reader lease stays regardless (``WeightBlobStore.prune``).
    """
    ordered = sorted(refs, key=lambda r: r.version)
    doomed = []
    for index, ref in enumerate(ordered[: max(0, len(ordered) - keep_last)]):
        superseded_at = ordered[index + 1].created_at_unix_s
        if now - superseded_at >= grace_s and ref.digest not in needed:
            doomed.append(ref)
    return doomed


class WeightBlobStore(abc.ABC):
    def __init__(self, *, keep_last: int, grace_s: float, leases: BlobLeases | None = None) -> None:
        self.keep_last = keep_last
        self.grace_s = grace_s
        #: Reader leases: when set, every read holds one and pruning spares leased versions.
        self.leases = leases

    @abc.abstractmethod
    def uri_for(self, hex_digest: str) -> str:
        """Where this transport keeps the blob of that digest."""

    def ref_for(self, version: int, digest: str, nbytes: int) -> BlobRef:
        """A reference to a blob known by its digest (a version chain names its links so)."""
        return BlobRef(
            version, digest, nbytes, self.uri_for(digest.removeprefix(DIGEST_PREFIX)), 0.0
        )

    @abc.abstractmethod
    async def put(self, version: int, source: BlobSource) -> BlobRef:
        """Store a version's bytes (tensors are saved as safetensors); idempotent per digest."""

    async def get_bytes(self, ref: BlobRef) -> bytes:
        """The blob's bytes, verified against ``ref.digest`` (read under a lease)."""
        async with self._lease(ref):
            return await self._read_bytes(ref)

    @abc.abstractmethod
    async def _read_bytes(self, ref: BlobRef) -> bytes:
        """The transport's read, verified against ``ref.digest``."""

    def _lease(self, ref: BlobRef) -> contextlib.AbstractAsyncContextManager[None]:
        if self.leases is None:
            return contextlib.nullcontext()
        return self.leases.hold(ref.hex, ref.version)

    async def get_to_path(self, ref: BlobRef, dest: Path) -> Path:
        """The blob written to ``dest`` (atomically), verified."""
        data = await self.get_bytes(ref)
        tmp = dest.with_name(dest.name + ".partial")
        tmp.write_bytes(data)
        tmp.replace(dest)
        return dest

    async def get_tensors(self, ref: BlobRef) -> dict[str, torch.Tensor]:
        from safetensors.torch import load

        return load(await self.get_bytes(ref))

    @abc.abstractmethod
    async def refs(self) -> list[BlobRef]:
        """Every stored version, oldest first."""

    @abc.abstractmethod
    async def delete(self, ref: BlobRef) -> None: ...

    async def prune(
        self, now: float | None = None, *, needed: Collection[str] = ()
    ) -> list[BlobRef]:
        """Apply the retention rule, sparing the ``needed`` digests; returns what was deleted."""
        now = time.time() if now is None else now
        candidates = prunable(await self.refs(), self.keep_last, self.grace_s, now, needed)
        leased: dict[str, list[str]] = {}
        if self.leases is not None and candidates:
            leased = await self.leases.live([ref.hex for ref in candidates], now)
        doomed = []
        for ref in candidates:
            if ref.hex in leased:
                readers = leased[ref.hex]
                log.info("weight_blob.kept_for_readers", version=ref.version, readers=readers)
            else:
                doomed.append(ref)
        for ref in doomed:
            await self.delete(ref)
            if self.leases is not None:
                await self.leases.forget(ref.hex)  # its records can never matter again
            log.info("weight_blob.pruned", version=ref.version, digest=ref.digest)
        return doomed


def new_ref(version: int, digest: str, nbytes: int, uri: str) -> BlobRef:
    return BlobRef(version, digest, nbytes, uri, time.time())
