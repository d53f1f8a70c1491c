"""Numpy array fields of the messages and their wire form.

On the wire an array is a map ``{"dtype": str, "shape": [int, ...], "data": [offset, nbytes]}``
whose ``data`` is a byte range of the message's array section (see ``docs/wire-format.md``):
the bytes are little-endian, C order, and every array starts at a multiple of 8 bytes. Decoding
makes a read-only ``np.frombuffer`` view of the decompressed frame, so array data is never
copied.

An array field is ``Annotated[np.ndarray, KIND]``. msgspec hands a descriptor to
:func:`dec_hook`, which checks what every array shares (whitelist, shape, range, alignment)
against the frame being decoded; the field's :class:`ArrayKind` then checks its dtype and values
in the message's ``__post_init__`` — the same check for a decoded frame and a message built in
Python (where lists are accepted and converted).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np

from dockyard.schemas.errors import ReasonCode, WireError
from dockyard.schemas.limits import DecodeLimits

#: Wire dtype names (numpy spellings) and their little-endian numpy dtypes.
WIRE_DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "float16",
        "float32",
        "float64",
    )
}
MAX_NDIM = 8
ARRAY_ALIGNMENT = 8

#: The same whitelist keyed by dtype: ``dtype.name`` is computed in Python and slow.
NAME_BY_DTYPE: dict[np.dtype, str] = {dtype: name for name, dtype in WIRE_DTYPES.items()}


def _bad(message: str) -> WireError:
    return WireError(ReasonCode.BAD_ARRAY, message)


def wire_dtype_name(dtype: np.dtype) -> str:
    name = NAME_BY_DTYPE.get(dtype)
    if name is None:
        name = NAME_BY_DTYPE.get(dtype.newbyteorder("<"))  # big-endian input
    if name is None:
        raise _bad(f"dtype {dtype} is not in the wire whitelist")
    return name


# --------------------------------------------------------------------------- decoding


class _Decoding(threading.local):
    """The frame being decoded on this thread: what :func:`dec_hook` resolves descriptors
    against (msgspec's hook has no argument for it)."""

    blob: memoryview | bytes | None = None
    limits: DecodeLimits | None = None


DECODING = _Decoding()


def dec_hook(kind: type, value: Any) -> Any:
    """msgspec's hook for the one custom type of the wire: an array descriptor → its view."""
    if kind is not np.ndarray:
        raise NotImplementedError(f"no wire type {kind}")
    blob, limits = DECODING.blob, DECODING.limits
    if blob is None or limits is None:
        raise WireError(ReasonCode.BAD_ARRAY, "an array descriptor outside a decoded frame")
    if type(value) is not dict:
        raise WireError(ReasonCode.WRONG_TYPE, f"expected an array descriptor, got {_name(value)}")
    return array_from_wire(value, blob, limits)


_WIRE_TYPE_NAMES: dict[type, str] = {list: "an array", str: "str", bytes: "bin"}


def _name(value: Any) -> str:
    return _WIRE_TYPE_NAMES.get(type(value), type(value).__name__)


def array_from_wire(
    descriptor: dict[str, Any], blob: memoryview | bytes, limits: DecodeLimits
) -> np.ndarray:
    """A read-only view of ``blob`` described by ``descriptor``; bounds checked first."""
    # Three entries, each key looked up: exactly the keys dtype, shape and data (a lookup that
    # misses is a key outside them), without building a key set per array.
    try:
        if len(descriptor) != 3:
            raise KeyError
        dtype_name, shape, data = descriptor["dtype"], descriptor["shape"], descriptor["data"]
    except (KeyError, TypeError):  # TypeError: an unhashable key such as a map
        raise _bad("an array is a map with keys dtype, shape, data") from None
    dtype = WIRE_DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise _bad(f"dtype {str(dtype_name)[:32]!r} is not in the wire whitelist")
    if type(shape) is not list or len(shape) > MAX_NDIM:
        raise _bad(f"shape must be a list of up to {MAX_NDIM} non-negative ints")
    if len(shape) == 1 and type(shape[0]) is int and shape[0] >= 0:
        count = shape[0]  # the message fields are 1-D: no loop for them
    else:
        count = 1
        for dim in shape:
            if type(dim) is not int or dim < 0:
                raise _bad(f"shape must be a list of up to {MAX_NDIM} non-negative ints")
            count *= dim
    if type(data) is not list or len(data) != 2:
        raise _bad("data must be [offset, nbytes] (non-negative ints)")
    offset, nbytes = data
    if type(offset) is not int or type(nbytes) is not int or offset < 0:
        raise _bad("data must be [offset, nbytes] (non-negative ints)")
    if count > limits.max_array_elements:
        raise WireError(
            ReasonCode.ARRAY_TOO_LARGE,
            f"{count} elements exceed the limit of {limits.max_array_elements}",
        )
    if count * dtype.itemsize != nbytes:
        raise _bad(f"shape {shape} of {dtype_name} needs {count * dtype.itemsize} B, not {nbytes}")
    if offset % ARRAY_ALIGNMENT:
        raise _bad(f"offset {offset} is not a multiple of {ARRAY_ALIGNMENT}")
    if offset + nbytes > len(blob):
        raise _bad(
            f"data range [{offset}, {offset + nbytes}) exceeds the array section ({len(blob)} B)"
        )
    if count == 0:
        empty = np.empty(shape, dtype=dtype)
        empty.flags.writeable = False
        return empty
    # A bool array's bytes (0 and 1 only) are checked by its field's kind: the mask is the
    # only field that takes bool, every other refuses the dtype.
    arr = np.frombuffer(blob, dtype=dtype, count=count, offset=offset)
    return arr if len(shape) == 1 else arr.reshape(shape)


def bytes_are_bools(arr: np.ndarray) -> bool:
    """False when ``arr`` is a ``bool`` array one of whose bytes is neither 0 nor 1.

    numpy reads any non-zero byte as True, so a view of a frame would pass on a byte the
    format does not define (``bool`` is 1 byte, 0 or 1): refused rather than read as True."""
    if arr.dtype.kind != "b" or not arr.size:
        return True
    return int(np.maximum.reduce(arr.view(np.uint8), axis=None)) <= 1


# --------------------------------------------------------------------------- encoding


_UINT8_MAX = np.iinfo(np.uint8).max
_UINT16_MAX = np.iinfo(np.uint16).max
_UINT32_MAX = np.iinfo(np.uint32).max
#: Each signed integer dtype (either byte order) and the unsigned dtype of the same width and
#: byte order: viewed as unsigned, a negative value is ≥ 2**(bits-1), so *one* ``max`` tells
#: whether every value lies in [0, limit] (min and max would take two passes).
_UNSIGNED_VIEW: dict[np.dtype, np.dtype] = {
    np.dtype(f"{order}i{size}"): np.dtype(f"{order}u{size}")
    for order in "<>"
    for size in (1, 2, 4, 8)
}


def narrow_unsigned(arr: np.ndarray) -> np.ndarray:
    """``arr`` in the narrowest unsigned dtype (uint8/16/32) that holds its non-negative
    integer values, else as is.

    Token ids (vocab < 65,536 for most tokenizers) fit in 16 bits, per-token weight versions in
    8 or 16: a half or a quarter of int32's bytes, which zstd then compresses faster and smaller
    (measured in ``benchmarks/bench_codec.py``). Decoders must read any whitelisted integer dtype.
    """
    dtype = arr.dtype
    if dtype.kind not in "iu" or dtype.itemsize <= 1 or arr.size == 0:
        return arr
    # ``np.maximum.reduce``: ``ndarray.max`` without its Python-level wrapper (``_amax``).
    if dtype.kind == "u":
        high = int(np.maximum.reduce(arr, axis=None))
    else:
        unsigned = _UNSIGNED_VIEW.get(dtype)
        if unsigned is None:
            return arr
        high = int(np.maximum.reduce(arr.view(unsigned), axis=None))
    if high <= _UINT8_MAX:
        return arr.astype(np.uint8)
    if high <= _UINT16_MAX and dtype.itemsize > 2:
        return arr.astype(np.uint16)
    if high <= _UINT32_MAX and dtype.itemsize > 4:
        return arr.astype(np.uint32)
    return arr


def unchanged(arr: np.ndarray) -> np.ndarray:
    return arr


# --------------------------------------------------------------------------- kinds


def _as_array(value: Any, default_dtype: np.dtype, what: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, list | tuple):  # producers may build messages from Python lists
        try:
            return np.asarray(value, dtype=default_dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise _bad(f"{what}: cannot convert to an array: {exc}") from exc
    raise WireError(ReasonCode.WRONG_TYPE, f"{what}: expected an array, got {type(value).__name__}")


def _whitelisted(dtype: np.dtype) -> bool:
    return dtype in NAME_BY_DTYPE or dtype.newbyteorder("<") in NAME_BY_DTYPE


def _check_tokens(arr: np.ndarray, what: str, limits: DecodeLimits | None) -> None:
    if arr.dtype.kind == "i" and arr.size and int(np.minimum.reduce(arr, axis=None)) < 0:
        raise WireError(ReasonCode.TOKEN_OUT_OF_VOCAB, f"{what} contain a negative value")
    if limits is not None and limits.vocab_size is not None and arr.size:
        top = int(np.maximum.reduce(arr, axis=None))
        if top >= limits.vocab_size:
            raise WireError(
                ReasonCode.TOKEN_OUT_OF_VOCAB,
                f"{what}: token id {top} is outside the vocabulary of {limits.vocab_size}",
            )


def _check_logprobs(arr: np.ndarray, what: str, limits: DecodeLimits | None) -> None:
    # One pass (isfinite into a byte per entry, then all): measured ≈ 25% cheaper than the
    # two NaN-propagating reductions min and max on a 64 KiB group's log-probs.
    if arr.size and not np.isfinite(arr).all():
        first = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise WireError(
            ReasonCode.NON_FINITE, f"{what} contain NaN or infinity (first at entry {first})"
        )


def _check_versions(arr: np.ndarray, what: str, limits: DecodeLimits | None) -> None:
    if arr.dtype.kind == "i" and arr.size and int(np.minimum.reduce(arr, axis=None)) < 0:
        raise WireError(ReasonCode.INVALID_FIELD, f"{what} contain a negative value")


def _check_mask(arr: np.ndarray, what: str, limits: DecodeLimits | None) -> None:
    if arr.dtype.kind == "u" and arr.size and int(np.maximum.reduce(arr, axis=None)) > 1:
        raise WireError(ReasonCode.INVALID_FIELD, f"{what}: a uint8 loss mask holds only 0 and 1")
    if not bytes_are_bools(arr):
        raise _bad(f"{what}: a bool array holds a byte other than 0 and 1")


@dataclass(frozen=True, eq=False)
class ArrayKind:
    """What an array field holds: the dtypes it accepts, how the encoder writes it, and the
    value checks. It rides along as metadata of the field's ``Annotated`` type."""

    name: str
    #: numpy dtype kinds (``dtype.kind``) allowed, and the one itemsize allowed (0: any).
    dtype_kinds: str
    #: The dtype a Python list is converted to.
    default_dtype: np.dtype
    #: Encoder-side transform (dtype narrowing); values are preserved exactly.
    transform: Callable[[np.ndarray], np.ndarray]
    values_check: Callable[[np.ndarray, str, DecodeLimits | None], None]
    #: Written in the frame's stored (not entropy-coded) tail: for values zstd barely shrinks,
    #: where compressing costs far more time than it saves bytes (``frames``).
    stored: bool = False
    itemsize: int = 0
    accepted: frozenset[np.dtype] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The whitelisted dtypes (either byte order) this kind takes, as a set: a decoded or
        # producer-built array's dtype is then one lookup, not three tests per array.
        accepted = frozenset(
            dtype
            for wire in WIRE_DTYPES.values()
            for dtype in (wire, wire.newbyteorder(">"))
            if self._takes(dtype)
        )
        object.__setattr__(self, "accepted", accepted)

    def _takes(self, dtype: np.dtype) -> bool:
        return (
            dtype.kind in self.dtype_kinds
            and not (self.itemsize and dtype.itemsize != self.itemsize)
            and _whitelisted(dtype)
        )

    def check(self, value: Any, what: str) -> np.ndarray:
        """``value`` as a checked 1-D array of this kind (WireError otherwise)."""
        try:
            return self._check(value, what)
        except WireError as exc:
            raise WireError(exc.reason, exc.detail, field=what) from None

    def _check(self, value: Any, what: str) -> np.ndarray:
        arr = value if type(value) is np.ndarray else _as_array(value, self.default_dtype, what)
        if arr.ndim != 1:
            raise _bad(f"{what} must be 1-D, got shape {list(arr.shape)}")
        if arr.dtype not in self.accepted and not self._takes(arr.dtype):
            raise _bad(f"{what} cannot have dtype {arr.dtype}")
        self.values_check(arr, what, DECODING.limits)
        return arr


TOKEN_IDS = ArrayKind("token_ids", "iu", np.dtype(np.int64), narrow_unsigned, _check_tokens)
# Float32 log-probs shrink ≈ 8% at zstd level 1 for ≈ 45% of the codec's zstd time
# (docs/benchmarks.md, codec section): they travel stored.
LOGPROBS = ArrayKind("logprobs", "f", np.dtype(np.float32), unchanged, _check_logprobs, stored=True)
VERSIONS = ArrayKind("versions", "iu", np.dtype(np.int64), narrow_unsigned, _check_versions)
MASK = ArrayKind("mask", "bu", np.dtype(np.bool_), unchanged, _check_mask, itemsize=1)

#: Token ids (1-D, non-negative integers). Narrowed to uint8/16/32 on the wire.
TokenIdArray = Annotated[np.ndarray, TOKEN_IDS]
#: Natural-log probabilities (1-D float16/32/64, finite). Travel at their own precision.
LogProbArray = Annotated[np.ndarray, LOGPROBS]
#: Weight version of each token (1-D, non-negative integers). Narrowed like token ids.
VersionArray = Annotated[np.ndarray, VERSIONS]
#: Loss mask (1-D bool, or uint8 of 0/1): 1 = a policy-generated token that is trained on.
MaskArray = Annotated[np.ndarray, MASK]
