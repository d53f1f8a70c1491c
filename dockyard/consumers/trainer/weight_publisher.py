"""The trainer's hand-off of new weights to the fleet: a blob (a full snapshot or a patch on the
previous version, ``weight_transport.patches``) and the weight event that names it."""

from __future__ import annotations

import time

import torch

from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.base import WeightBlobStore
from dockyard.broker.weight_blobs.chain import ChainPublisher, PublishedBlob
from dockyard.consumers.trainer.progress import Progress
from dockyard.consumers.trainer.ranks import TrainerRanks
from dockyard.schemas import WeightVersion


class WeightPublisher:
    def __init__(
        self,
        messages: MessagePlane,
        weights: WeightBlobStore,
        ranks: TrainerRanks,
        progress: Progress,
        *,
        dtype: torch.dtype,
        producer_id: str,
    ) -> None:
        """``dtype``: ``policy.precision``, what the engines load."""
        self.messages = messages
        self.weights = weights
        self.ranks = ranks
        self.progress = progress
        self.dtype = dtype
        self.producer_id = producer_id
        patches = messages.plane.config.weight_transport.patches
        self.chain = ChainPublisher(
            weights, enabled=patches.enabled, snapshot_every=patches.snapshot_every
        )
        self.last: PublishedBlob | None = None

    async def publish(self) -> None:
        """The current weights as ``progress.weight_version``."""
        progress = self.progress
        # In policy.precision, on the CPU: what the engines load. No copy when the master
        # weights already are that (float32 on the CPU): training is paused while the blob is
        # written (it is awaited), and the serializer copies only tensors that share storage
        # (tied embeddings).
        state = {
            name: tensor.detach().to("cpu", self.dtype)
            for name, tensor in self.ranks.engine_weights().items()
        }
        blob = await self.chain.publish(progress.weight_version, state)
        ref = blob.ref
        event = WeightVersion(
            version=progress.weight_version,
            step=progress.step,
            blob_ref=ref.uri,
            digest=ref.digest,
            nbytes=ref.nbytes,
            format=blob.format,
            dtype=str(next(iter(state.values())).dtype).removeprefix("torch."),
            delta_base_version=blob.delta_base_version,
            created_at_unix_s=time.time(),
            producer_id=self.producer_id,
        )
        await self.messages.publish(event)
        progress.summary.weight_version = progress.weight_version
        self.last = blob
        await self.weights.prune(needed=self.chain.needed)

    def metrics(self) -> dict[str, float]:
        """The size of the weight blob just published, and for a patch its changed fraction."""
        blob = self.last
        if blob is None:
            return {}
        metrics = {"weights/blob_bytes": float(blob.ref.nbytes)}
        if blob.changed_fraction is not None:
            metrics["weights/patch_changed_fraction"] = blob.changed_fraction
        return metrics
