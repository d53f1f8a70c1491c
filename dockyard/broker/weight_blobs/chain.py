"""Version chains of weight blobs: a full snapshot, then patches, each on the version before.

The trainer's :class:`ChainPublisher` decides per version whether to store a snapshot or a
patch (``data_plane.weight_transport.patches``): a snapshot every ``snapshot_every`` versions,
patches in between, and a snapshot whenever a patch cannot be made (the first version of a
process, tensors added or reshaped) or would not be much smaller than the weights.

A worker's :class:`ChainFollower` holds the weights it last loaded. A patch on exactly those
weights is applied; a worker that missed a patch, joins late or restarted reads the chain the
newest patch names (its snapshot and the patches after it) and replays it. Every step checks
the base it applies to and the digest of what it makes; nothing unverified is returned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dockyard.broker.weight_blobs.base import BlobRef, WeightBlobStore
from dockyard.broker.weight_blobs.patch import (
    PATCH_FORMAT,
    SNAPSHOT_FORMAT,
    ChainLink,
    DecodedPatch,
    PatchError,
    PatchHeader,
    apply_patch,
    decode_patch,
    encode_patch,
    state_digest,
)
from dockyard.utils.logging import get_logger

if TYPE_CHECKING:
    import torch

    from dockyard.schemas import WeightVersion

log = get_logger(__name__)

#: A patch at least this fraction of the weights' raw size is not worth a chain link.
MAX_PATCH_FRACTION = 0.5

State = dict[str, "torch.Tensor"]


@dataclass(frozen=True)
class PublishedBlob:
    """What the trainer's weight event says about the blob it names."""

    ref: BlobRef
    format: str
    delta_base_version: int | None
    changed_fraction: float | None  # of the elements, for a patch


def _copy(state: State) -> State:
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def _raw_nbytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class ChainPublisher:
    """Trainer side: stores each version as a snapshot or a patch on the previous one.

    Holds the last published weights (one copy of them in engine dtype, on the CPU) to diff
    against; with patches off it holds nothing and stores every version whole."""

    def __init__(self, store: WeightBlobStore, *, enabled: bool, snapshot_every: int) -> None:
        self.store = store
        self.enabled = enabled
        self.snapshot_every = snapshot_every
        self._base: State | None = None
        self._base_version = -1
        self._base_digest = ""
        self._snapshot: ChainLink | None = None
        self._chain: list[ChainLink] = []

    @property
    def needed(self) -> set[str]:
        """Blob digests the current chain needs (snapshot and patches): retention keeps them."""
        links = ([self._snapshot] if self._snapshot else []) + self._chain
        return {link.blob_digest for link in links}

    async def publish(self, version: int, state: State) -> PublishedBlob:
        if not self.enabled:
            return PublishedBlob(await self.store.put(version, state), SNAPSHOT_FORMAT, None, None)
        digest = await asyncio.to_thread(state_digest, state)
        patch = await self._try_patch(version, state, digest)
        if patch is None:
            ref = await self.store.put(version, state)
            self._snapshot, self._chain = ChainLink(version, ref.digest, ref.nbytes), []
            published = PublishedBlob(ref, SNAPSHOT_FORMAT, None, None)
        else:
            blob, fraction = patch
            ref = await self.store.put(version, blob)
            self._chain.append(ChainLink(version, ref.digest, ref.nbytes))
            published = PublishedBlob(ref, PATCH_FORMAT, self._base_version, fraction)
        # A copy: the trainer may hand over its live parameters (float32 weights published as
        # they are), which the next optimizer step changes in place.
        self._base = await asyncio.to_thread(_copy, state)
        self._base_version, self._base_digest = version, digest
        return published

    async def _try_patch(
        self, version: int, state: State, digest: str
    ) -> tuple[bytes, float] | None:
        """The patch blob and its changed fraction, or None when a snapshot is due."""
        if self._base is None or self._snapshot is None:
            return None
        if len(self._chain) + 1 >= self.snapshot_every:
            return None
        header = PatchHeader(
            version=version,
            base_version=self._base_version,
            base_digest=self._base_digest,
            result_digest=digest,
            snapshot=self._snapshot,
            chain=tuple(self._chain),
        )
        try:
            blob, stats = await asyncio.to_thread(encode_patch, self._base, state, header)
        except PatchError as error:
            log.info("weights.snapshot_instead_of_patch", version=version, reason=str(error))
            return None
        if len(blob) >= MAX_PATCH_FRACTION * _raw_nbytes(state):
            log.info(
                "weights.snapshot_instead_of_patch",
                version=version,
                reason=f"patch of {len(blob)} bytes, {stats.changed_fraction:.1%} changed",
            )
            return None
        return blob, stats.changed_fraction


class ChainFollower:
    """Worker side: turns weight events (snapshots or patches) into verified full weights.

    ``retain``: keep the last weights to apply the next patch to (one CPU copy of the model in
    engine dtype). Without it every patch event is a catch-up from its chain's snapshot."""

    def __init__(self, store: WeightBlobStore, *, retain: bool) -> None:
        self.store = store
        self.retain = retain
        self.version = -1
        self.digest = ""
        self._state: State | None = None
        self.catch_ups = 0

    async def resolve(self, event: WeightVersion) -> State:
        """The full weights of ``event``'s version; raises :class:`PatchError` (or the store's
        ``BlobNotFound`` / ``BlobDigestMismatch``) without changing what is held."""
        ref = self.store.ref_for(event.version, event.digest, event.nbytes)
        if event.format == SNAPSHOT_FORMAT:
            if event.delta_base_version is not None:
                raise PatchError(f"v{event.version}: a {SNAPSHOT_FORMAT} blob with a delta base")
            state = await self.store.get_tensors(ref)
            return await self._hold(event.version, state)
        if event.format != PATCH_FORMAT:
            raise PatchError(f"v{event.version}: unknown weight blob format {event.format!r}")
        patch = decode_patch(await self.store.get_bytes(ref))
        header = patch.header
        if header.version != event.version or header.base_version != event.delta_base_version:
            raise PatchError(
                f"v{event.version}: the event says a patch on v{event.delta_base_version}, the "
                f"blob is v{header.version} on v{header.base_version}"
            )
        if self._state is None or (self.version, self.digest) != (
            header.base_version,
            header.base_digest,
        ):
            await self._catch_up(header)
        assert self._state is not None
        state = await asyncio.to_thread(
            apply_patch, self._state, patch, base_version=self.version, base_digest=self.digest
        )
        return await self._hold(header.version, state, header.result_digest)

    async def _catch_up(self, header: PatchHeader) -> None:
        """Rebuild the base of ``header``'s patch from its chain: from the weights held when
        they are on the chain, else from the chain's snapshot."""
        links = [header.snapshot, *header.chain]
        versions = [link.version for link in links]
        start = 0
        if self._state is not None and self.version in versions:
            start = versions.index(self.version) + 1
        log.info(
            "weights.catch_up",
            target=header.version,
            held=self.version,
            snapshot=header.snapshot.version,
            patches=len(links) - max(start, 1) + 1,
        )
        self.catch_ups += 1
        if start == 0:
            snapshot = header.snapshot
            ref = self.store.ref_for(snapshot.version, snapshot.blob_digest, snapshot.nbytes)
            state = await self.store.get_tensors(ref)
            await self._hold(snapshot.version, state, keep=True)
            start = 1
        for link in links[start:]:
            ref = self.store.ref_for(link.version, link.blob_digest, link.nbytes)
            patch: DecodedPatch = decode_patch(await self.store.get_bytes(ref))
            assert self._state is not None
            state = await asyncio.to_thread(
                apply_patch, self._state, patch, base_version=self.version, base_digest=self.digest
            )
            await self._hold(link.version, state, patch.header.result_digest, keep=True)

    async def _hold(
        self, version: int, state: State, digest: str | None = None, *, keep: bool = False
    ) -> State:
        if not (self.retain or keep):  # nothing to patch later: no digest needed either
            self.version, self.digest, self._state = version, "", None
            return state
        if digest is None:
            digest = await asyncio.to_thread(state_digest, state)
        self.version, self.digest, self._state = version, digest, state
        return state
