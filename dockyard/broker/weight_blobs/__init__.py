"""Weight blobs: content-addressed, verified on read, with pluggable transports.

The trainer ``put``s a version (tensors, bytes or a file) and publishes a ``WeightVersion``
event naming the blob's digest and URI; workers ``get`` it and the store refuses bytes whose
SHA-256 does not match. Transports: JetStream chunks (default), a shared filesystem path, or an
HTTP URL (a directory the trainer writes, served by any web server). See ``create_weight_store``.
"""

from dockyard.broker.weight_blobs.base import (
    BlobDigestMismatch,
    BlobNotFound,
    BlobRef,
    WeightBlobStore,
)
from dockyard.broker.weight_blobs.factory import create_weight_store

__all__ = [
    "BlobDigestMismatch",
    "BlobNotFound",
    "BlobRef",
    "WeightBlobStore",
    "create_weight_store",
]
