"""Lossless sparse weight patches: the elements that changed between two weight versions.

At RL learning rates most elements of the engine-dtype (bf16) weights are bit-for-bit unchanged
from one version to the next: the optimizer's step is below half a bf16 ulp for them (PULSE,
arXiv 2602.03839). A patch carries, per tensor with a change, the flat indices of the changed
elements and their new values, so the patched weights are *bit-identical* to the full ones; a
digest of the whole result (:func:`state_digest`) is in the patch and checked before the
weights are used.

Coding (documented in ``docs/wire-format.md``, "Weight patches"):

- indices: ascending, as gaps (the first index itself, then differences) in ``uint32``;
- values: the new element's bit pattern minus the base's, as the signed integer of the
  element's width, modulo 2**bits, zigzag-coded (0, −1, 1, −2, ... → 0, 1, 2, 3, ...). Exact
  (integer arithmetic on bit patterns, no float delta, so no drift over a chain), and small: a
  bf16 element that moved by one rounding step differs by ±1, which zigzag makes 1 or 2;
- each array byte-shuffled (byte planes, as blosc does: the high bytes of small numbers are
  zeros and compress to nothing) and zstd-compressed in a frame that declares its size, so a
  reader refuses an oversized frame before allocating it.

The container is one msgpack map (see :func:`encode_patch`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np

from dockyard.broker.plane import DataPlaneError
from dockyard.schemas.errors import CodecError
from dockyard.schemas.frames import compress, decompress_declared

# ``WeightVersion.format`` of a patch (``delta_base_version`` set) and of a full snapshot: the
# event's schema owns them (it checks the pair); re-exported beside the patch coding.
from dockyard.schemas.weight_version import PATCH_FORMAT as PATCH_FORMAT
from dockyard.schemas.weight_version import SNAPSHOT_FORMAT as SNAPSHOT_FORMAT

if TYPE_CHECKING:
    import torch

PATCH_FORMAT_VERSION = 1
STATE_DIGEST_PREFIX = "sha256:"
_ZSTD_LEVEL = 3
#: Signed integer dtype of each element width: the bit pattern the patch works on.
_BITS: dict[int, type[np.signedinteger[Any]]] = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UNSIGNED: dict[int, type[np.unsignedinteger[Any]]] = {
    1: np.uint8,
    2: np.uint16,
    4: np.uint32,
    8: np.uint64,
}


class PatchError(DataPlaneError):
    """A patch that cannot be applied (wrong base, corrupt, incomplete): the reason says why."""


@dataclass(frozen=True)
class ChainLink:
    """One blob of a version chain: where to read it and what version it makes."""

    version: int
    blob_digest: str  # the blob's content address (sha256 of its bytes)
    nbytes: int

    def to_wire(self) -> dict[str, Any]:
        return {"version": self.version, "blob_digest": self.blob_digest, "nbytes": self.nbytes}

    @classmethod
    def from_wire(cls, raw: object) -> ChainLink:
        if not isinstance(raw, dict) or set(raw) != {"version", "blob_digest", "nbytes"}:
            raise PatchError(f"patch chain entry {raw!r} is not a chain link")
        version, digest, nbytes = raw["version"], raw["blob_digest"], raw["nbytes"]
        if not (isinstance(version, int) and isinstance(nbytes, int) and isinstance(digest, str)):
            raise PatchError(f"patch chain entry {raw!r} has fields of the wrong type")
        return cls(version, digest, nbytes)


@dataclass(frozen=True)
class PatchHeader:
    """What a patch says about itself, besides its tensors."""

    version: int
    base_version: int
    base_digest: str  # state digest of the weights it applies to
    result_digest: str  # state digest of the weights it makes
    #: The full snapshot the chain starts at, then every patch after it before this one: what
    #: a reader that does not hold the base fetches to catch up.
    snapshot: ChainLink
    chain: tuple[ChainLink, ...] = field(default=())


@dataclass(frozen=True)
class PatchStats:
    changed: int
    total: int

    @property
    def changed_fraction(self) -> float:
        return self.changed / self.total if self.total else 0.0


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor in name order: name, dtype, shape, then its raw bytes.

    Names, dtypes and shapes are hashed too, so a result with the right bytes under the wrong
    layout is still refused. Each field is length-prefixed so no two states hash the same."""
    hasher = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name]
        meta = f"{name}\0{str(tensor.dtype).removeprefix('torch.')}\0{tuple(tensor.shape)}".encode()
        raw = _raw_bytes(tensor)
        hasher.update(len(meta).to_bytes(8, "little"))
        hasher.update(meta)
        hasher.update(len(raw).to_bytes(8, "little"))
        hasher.update(raw)
    return STATE_DIGEST_PREFIX + hasher.hexdigest()


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    import torch

    flat = tensor.detach().contiguous().reshape(-1).cpu()
    return flat.view(torch.uint8).numpy().data.cast("B")


def _bits(tensor: torch.Tensor) -> np.ndarray:
    """The elements' bit patterns as signed integers of their width (no copy when contiguous)."""
    import torch

    width = tensor.element_size()
    if width not in _BITS:
        raise PatchError(f"no bit view for {tensor.dtype} ({width}-byte elements)")
    flat = tensor.detach().contiguous().reshape(-1).cpu()
    return flat.view(torch.uint8).numpy().view(_BITS[width])


def _zigzag(signed: np.ndarray) -> np.ndarray:
    """Small magnitudes of either sign to small unsigned numbers (as protobuf's sint)."""
    width = signed.itemsize
    unsigned = signed.view(_UNSIGNED[width])
    zigzagged: np.ndarray = (unsigned << 1) ^ (signed >> (8 * width - 1)).view(_UNSIGNED[width])
    return zigzagged


def _unzigzag(unsigned: np.ndarray) -> np.ndarray:
    width = unsigned.itemsize
    all_ones = np.iinfo(_UNSIGNED[width]).max
    return ((unsigned >> 1) ^ ((unsigned & 1) * all_ones)).view(_BITS[width])


def _shuffle_compress(values: np.ndarray) -> bytes:
    planes = values.view(np.uint8).reshape(-1, values.itemsize).T
    return compress(np.ascontiguousarray(planes).tobytes(), _ZSTD_LEVEL)


def _decompress_unshuffle(frame: object, count: int, dtype: type[np.generic], what: str) -> Any:
    if not isinstance(frame, bytes):
        raise PatchError(f"{what} is not bytes")
    itemsize = np.dtype(dtype).itemsize
    expected = count * itemsize
    try:
        # The frame must declare exactly ``expected`` (docs/wire-format.md): one that declares
        # nothing would be streamed and one that declares less read before it is refused.
        raw = decompress_declared(frame, expected)
    except CodecError as error:
        raise PatchError(f"{what}: {error}") from None
    if len(raw) != expected:
        raise PatchError(f"{what}: {len(raw)} bytes, {count} elements need {expected}")
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(itemsize, count)
    return np.ascontiguousarray(planes.T).reshape(-1).view(dtype)


def encode_patch(
    base: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    header: PatchHeader,
) -> tuple[bytes, PatchStats]:
    """The patch that turns ``base`` into ``new`` (same names, dtypes and shapes).

    Returns the blob and how many elements changed. Raises :class:`PatchError` when the two
    states differ in layout (a patch cannot add or reshape tensors: publish a snapshot)."""
    if set(base) != set(new):
        missing, extra = sorted(set(base) - set(new)), sorted(set(new) - set(base))
        raise PatchError(f"tensor names differ from the base (gone {missing[:3]}, new {extra[:3]})")
    tensors = []
    changed = total = 0
    for name in sorted(new):
        old_t, new_t = base[name], new[name]
        if old_t.dtype != new_t.dtype or tuple(old_t.shape) != tuple(new_t.shape):
            raise PatchError(
                f"tensor {name}: {new_t.dtype}{tuple(new_t.shape)} vs the base's "
                f"{old_t.dtype}{tuple(old_t.shape)}"
            )
        if new_t.numel() >= 2**32:
            raise PatchError(f"tensor {name} has ≥ 2**32 elements: uint32 gaps cannot index it")
        old_bits, new_bits = _bits(old_t), _bits(new_t)
        total += new_bits.size
        indices = np.flatnonzero(old_bits != new_bits)
        if indices.size == 0:
            continue
        changed += indices.size
        # Modular: numpy integer arrays wrap on overflow, which is what makes the delta exact.
        deltas = new_bits[indices] - old_bits[indices]
        gaps = np.diff(indices, prepend=0).astype(np.uint32)
        tensors.append(
            {
                "name": name,
                "count": int(indices.size),
                "index_gaps": _shuffle_compress(gaps),
                "value_deltas": _shuffle_compress(_zigzag(deltas)),
            }
        )
    body = {
        "format": PATCH_FORMAT,
        "format_version": PATCH_FORMAT_VERSION,
        "version": header.version,
        "base_version": header.base_version,
        "base_digest": header.base_digest,
        "result_digest": header.result_digest,
        "snapshot": header.snapshot.to_wire(),
        "chain": [link.to_wire() for link in header.chain],
        "tensors": tensors,
    }
    return msgpack.packb(body, use_bin_type=True), PatchStats(changed, total)


@dataclass(frozen=True)
class DecodedPatch:
    header: PatchHeader
    tensors: list[dict[str, Any]]


_KEYS = {
    "format",
    "format_version",
    "version",
    "base_version",
    "base_digest",
    "result_digest",
    "snapshot",
    "chain",
    "tensors",
}


def decode_patch(blob: bytes) -> DecodedPatch:
    """The patch's header and (still compressed) tensors; refuses anything malformed."""
    try:
        body = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as error:
        raise PatchError(f"not a weight patch (msgpack: {error})") from None
    if not isinstance(body, dict) or set(body) != _KEYS:
        keys = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise PatchError(f"not a weight patch: keys {keys}")
    if body["format"] != PATCH_FORMAT or body["format_version"] != PATCH_FORMAT_VERSION:
        raise PatchError(
            f"patch format {body['format']!r} v{body['format_version']!r}; this reader "
            f"knows {PATCH_FORMAT!r} v{PATCH_FORMAT_VERSION}"
        )
    ints = ("version", "base_version")
    strs = ("base_digest", "result_digest")
    if not all(isinstance(body[k], int) for k in ints) or not all(
        isinstance(body[k], str) for k in strs
    ):
        raise PatchError("patch header fields have the wrong types")
    if not isinstance(body["chain"], list) or not isinstance(body["tensors"], list):
        raise PatchError("patch chain and tensors must be lists")
    header = PatchHeader(
        version=body["version"],
        base_version=body["base_version"],
        base_digest=body["base_digest"],
        result_digest=body["result_digest"],
        snapshot=ChainLink.from_wire(body["snapshot"]),
        chain=tuple(ChainLink.from_wire(link) for link in body["chain"]),
    )
    return DecodedPatch(header, body["tensors"])


def apply_patch(
    base: Mapping[str, torch.Tensor],
    blob: bytes | DecodedPatch,
    *,
    base_version: int,
    base_digest: str,
) -> dict[str, torch.Tensor]:
    """``base`` patched into the patch's version, verified against the patch's result digest.

    ``base`` is not modified (a refused patch leaves the caller's weights intact): the touched
    tensors are copies, the untouched ones are shared with ``base``. Refuses a patch made for
    another base (version or digest) and a result that does not hash to ``result_digest``."""
    patch = blob if isinstance(blob, DecodedPatch) else decode_patch(blob)
    header = patch.header
    if header.base_version != base_version or header.base_digest != base_digest:
        raise PatchError(
            f"patch v{header.version} applies to v{header.base_version} "
            f"({header.base_digest[:19]}…), the weights held are v{base_version} "
            f"({base_digest[:19]}…): out of order or from another chain"
        )
    result = dict(base)
    previous: str | None = None
    for entry in patch.tensors:
        if not isinstance(entry, dict) or set(entry) != {
            "name",
            "count",
            "index_gaps",
            "value_deltas",
        }:
            raise PatchError(f"patch v{header.version}: malformed tensor entry")
        name, count = entry["name"], entry["count"]
        if name not in base or result[name] is not base[name]:
            raise PatchError(f"patch v{header.version}: unknown or repeated tensor {name!r}")
        # The document's order (code point order, as the encoder sorts): one spelling per patch.
        if previous is not None and name < previous:
            raise PatchError(
                f"patch v{header.version}: tensor {name!r} after {previous!r} is not in name order"
            )
        previous = name
        if not isinstance(count, int) or not 0 < count <= base[name].numel():
            raise PatchError(f"patch v{header.version}: tensor {name} change count {count!r}")
        target = base[name].detach().contiguous().clone()
        bits = _bits(target)  # a view of ``target``'s storage: written in place below
        where = f"patch v{header.version} tensor {name}"
        gaps = _decompress_unshuffle(entry["index_gaps"], count, np.uint32, f"{where} indices")
        zigzag = _decompress_unshuffle(
            entry["value_deltas"], count, _UNSIGNED[bits.itemsize], f"{where} values"
        )
        indices = np.cumsum(gaps, dtype=np.int64)
        if indices[-1] >= bits.size or (count > 1 and not np.all(gaps[1:] > 0)):
            raise PatchError(f"{where}: indices out of range or not ascending")
        bits[indices] += _unzigzag(zigzag)
        result[name] = target
    digest = state_digest(result)
    if digest != header.result_digest:
        raise PatchError(
            f"patch v{header.version}: the patched weights hash to {digest}, the patch says "
            f"{header.result_digest}; refusing them"
        )
    return result
