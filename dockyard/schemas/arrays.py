"""Numpy array fields of the message models and their wire form.

On the wire an array is a map ``{"dtype": str, "shape": [int, ...], "data": [offset, nbytes]}``
whose ``data`` is a byte range of the message's array section (see ``docs/wire-format.md``):
the bytes are little-endian, C order, and every array starts at a multiple of 8 bytes. Decoding
makes a read-only ``np.frombuffer`` view of the decompressed frame, so array data is never
copied.

The validators run both when a producer builds a model (lists are accepted and converted) and
when the codec decodes one (then the validation *context* carries the frame's array section and
the :class:`~dockyard.schemas.limits.DecodeLimits`). Errors are ``PydanticCustomError`` whose
type is a :class:`~dockyard.schemas.errors.ReasonCode` value, so the codec maps them 1:1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import PlainSerializer, PlainValidator, SerializationInfo, ValidationInfo
from pydantic.json_schema import WithJsonSchema
from pydantic_core import PydanticCustomError

from dockyard.schemas.errors import ReasonCode
from dockyard.schemas.limits import DEFAULT_LIMITS, DecodeLimits

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

# Keys of the pydantic validation / serialization context used by the codec.
CTX_BLOB = "dockyard_array_section"
CTX_LIMITS = "dockyard_limits"
#: Set by the codec when every array in the input was resolved and checked once per message
#: (``dockyard.schemas.precheck``): the field validators then accept those arrays as they are.
CTX_PRECHECKED = "dockyard_arrays_prechecked"


def _refuse(reason: ReasonCode, message: str) -> PydanticCustomError:
    # Braces in the message would be read as template fields by pydantic.
    safe = message.replace("{", "(").replace("}", ")")
    return PydanticCustomError(reason.value, safe)


#: The same whitelist keyed by dtype: ``dtype.name`` is computed in Python and slow.
_NAME_BY_DTYPE: dict[np.dtype, str] = {dtype: name for name, dtype in WIRE_DTYPES.items()}


def wire_dtype_name(dtype: np.dtype) -> str:
    name = _NAME_BY_DTYPE.get(dtype)
    if name is None:
        name = _NAME_BY_DTYPE.get(dtype.newbyteorder("<"))  # big-endian input
    if name is None:
        raise _refuse(ReasonCode.BAD_ARRAY, f"dtype {dtype} is not in the wire whitelist")
    return name


# --------------------------------------------------------------------------- decoding


def _bad(message: str) -> PydanticCustomError:
    return _refuse(ReasonCode.BAD_ARRAY, message)


def array_from_wire(descriptor: Any, blob: memoryview, limits: DecodeLimits) -> np.ndarray:
    """A read-only view of ``blob`` described by ``descriptor``; bounds checked first."""
    # This runs for every array of every message: the common 1-D case is kept to a few
    # dict lookups and type checks (measured in benchmarks/bench_codec.py).
    if type(descriptor) is not dict or len(descriptor) != 3:
        raise _bad("an array is a map with keys dtype, shape, data")
    try:
        dtype_name, shape, data = descriptor["dtype"], descriptor["shape"], descriptor["data"]
    except KeyError:
        raise _bad("an array is a map with keys dtype, shape, data") from None
    dtype = WIRE_DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise _bad(f"dtype {str(dtype_name)[:32]!r} is not in the wire whitelist")
    if type(shape) is not list or len(shape) > MAX_NDIM:
        raise _bad(f"shape must be a list of up to {MAX_NDIM} non-negative ints")
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
        raise _refuse(
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
    arr = np.frombuffer(blob, dtype=dtype, count=count, offset=offset)
    if not bytes_are_bools(arr):
        raise _bad("a bool array holds a byte other than 0 and 1")
    return arr if len(shape) == 1 else arr.reshape(shape)


def bytes_are_bools(arr: np.ndarray) -> bool:
    """False when ``arr`` is a ``bool`` array one of whose bytes is neither 0 nor 1.

    numpy reads any non-zero byte as True, so a view of a frame would pass on a byte the
    format does not define (``bool`` is 1 byte, 0 or 1): refused rather than read as True."""
    if arr.dtype.kind != "b" or not arr.size:
        return True
    return int(np.maximum.reduce(arr.view(np.uint8), axis=None)) <= 1


def _as_array(value: Any, info: ValidationInfo, default_dtype: np.dtype) -> np.ndarray:
    context = info.context
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict):
        if not context or CTX_BLOB not in context:
            raise _refuse(ReasonCode.BAD_ARRAY, "an array descriptor outside a decoded frame")
        return array_from_wire(value, context[CTX_BLOB], context.get(CTX_LIMITS, DEFAULT_LIMITS))
    if isinstance(value, list | tuple) and not (context and CTX_BLOB in context):
        # Producers may build messages from Python lists; the wire never carries lists.
        try:
            return np.asarray(value, dtype=default_dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise _refuse(ReasonCode.BAD_ARRAY, f"cannot convert to an array: {exc}") from exc
    raise _refuse(ReasonCode.WRONG_TYPE, f"expected an array, got {type(value).__name__}")


def _prechecked(value: Any, info: ValidationInfo) -> bool:
    # Only the codec's pre-pass puts ndarrays into decoded metadata (msgpack never makes one).
    if type(value) is not np.ndarray:
        return False
    context = info.context
    return context is not None and CTX_PRECHECKED in context


def _limits(info: ValidationInfo) -> DecodeLimits | None:
    context = info.context
    return context.get(CTX_LIMITS) if context else None


def _check_1d(arr: np.ndarray, kinds: str, what: str) -> None:
    if arr.ndim != 1:
        raise _refuse(ReasonCode.BAD_ARRAY, f"{what} must be 1-D, got shape {list(arr.shape)}")
    dtype = arr.dtype
    if dtype.kind not in kinds or (
        dtype not in _NAME_BY_DTYPE and dtype.newbyteorder("<") not in _NAME_BY_DTYPE
    ):
        raise _refuse(ReasonCode.BAD_ARRAY, f"{what} cannot have dtype {dtype}")


def _check_non_negative(arr: np.ndarray, reason: ReasonCode, what: str) -> None:
    if arr.dtype.kind == "i" and arr.size and int(arr.min()) < 0:
        raise _refuse(reason, f"{what} contain a negative value ({int(arr.min())})")


def validate_token_ids(value: Any, info: ValidationInfo) -> np.ndarray:
    if _prechecked(value, info):
        return value
    arr = _as_array(value, info, np.dtype(np.int64))
    _check_1d(arr, "iu", "token ids")
    _check_non_negative(arr, ReasonCode.TOKEN_OUT_OF_VOCAB, "token ids")
    limits = _limits(info)
    if limits is not None and limits.vocab_size is not None and arr.size:
        top = int(arr.max())
        if top >= limits.vocab_size:
            raise _refuse(
                ReasonCode.TOKEN_OUT_OF_VOCAB,
                f"token id {top} is outside the vocabulary of {limits.vocab_size}",
            )
    return arr


def validate_logprobs(value: Any, info: ValidationInfo) -> np.ndarray:
    if _prechecked(value, info):
        return value
    arr = _as_array(value, info, np.dtype(np.float32))
    _check_1d(arr, "f", "log-probs")
    # min and max propagate NaN and expose ±inf: two reductions and no temporary array.
    if arr.size and not (math.isfinite(arr.min()) and math.isfinite(arr.max())):
        first = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise _refuse(
            ReasonCode.NON_FINITE, f"log-probs contain NaN or infinity (first at entry {first})"
        )
    return arr


def validate_versions(value: Any, info: ValidationInfo) -> np.ndarray:
    if _prechecked(value, info):
        return value
    arr = _as_array(value, info, np.dtype(np.int64))
    _check_1d(arr, "iu", "weight versions")
    _check_non_negative(arr, ReasonCode.INVALID_FIELD, "weight versions")
    return arr


def validate_mask(value: Any, info: ValidationInfo) -> np.ndarray:
    if _prechecked(value, info):
        return value
    arr = _as_array(value, info, np.dtype(np.bool_))
    if arr.ndim != 1 or arr.dtype.kind not in "bu" or arr.dtype.itemsize != 1:
        raise _refuse(ReasonCode.BAD_ARRAY, f"a loss mask is 1-D bool or uint8, got {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > 1:
        raise _refuse(ReasonCode.INVALID_FIELD, "a uint8 loss mask holds only 0 and 1")
    if not bytes_are_bools(arr):  # a column's slice (``precheck``) is not read by array_from_wire
        raise _bad("a bool array holds a byte other than 0 and 1")
    return arr


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


def narrow_unsigned_max(arr: np.ndarray) -> int | None:
    """The largest value of a non-empty integer ``arr`` read as unsigned (a negative value
    counts as huge), i.e. the bound narrowing must respect; None for other dtypes."""
    # ``np.maximum.reduce``: ``ndarray.max`` without its Python-level wrapper (``_amax``).
    dtype = arr.dtype
    if dtype.kind == "u":
        return int(np.maximum.reduce(arr, axis=None))
    unsigned = _UNSIGNED_VIEW.get(dtype)
    return None if unsigned is None else int(np.maximum.reduce(arr.view(unsigned), axis=None))


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
    high = narrow_unsigned_max(arr)
    if high is None:
        return arr
    if high <= _UINT8_MAX:
        return arr.astype(np.uint8)
    if high <= _UINT16_MAX and dtype.itemsize > 2:
        return arr.astype(np.uint16)
    if high <= _UINT32_MAX and dtype.itemsize > 4:
        return arr.astype(np.uint32)
    return arr


def _serialize(arr: np.ndarray, info: SerializationInfo) -> Any:
    """``model_dump``: the array itself, or a list in JSON mode (the codec does not use this)."""
    if info.mode == "json":
        return arr.tolist()
    return arr


def unchanged(arr: np.ndarray) -> np.ndarray:
    return arr


@dataclass(frozen=True, eq=False)
class ArrayKind:
    """What an array field holds: the wire dtypes it accepts, how the encoder writes it, and the
    value checks a decoder runs. It rides along as metadata of the field's ``Annotated`` type,
    so the codec's per-message passes (``layout`` on encode, ``precheck`` on decode) find every
    array field of a model without a pydantic call per array.
    """

    name: str
    #: The little-endian wire dtypes a decoded array of this kind may have (all 1-D).
    dtypes: frozenset[np.dtype]
    #: Encoder-side transform (dtype narrowing); values are preserved exactly.
    transform: Callable[[np.ndarray], np.ndarray]
    #: ``values_ok(arr, limits)``: True when every value passes this kind's decode checks.
    #: The same checks as the field validator above, as one boolean over any run of values.
    values_ok: Callable[[np.ndarray, DecodeLimits], bool]
    #: ``needs_values_check(dtype, limits)``: False when no value of ``dtype`` can fail.
    needs_values_check: Callable[[np.dtype, DecodeLimits], bool]
    #: Written in the frame's stored (not entropy-coded) tail: for values zstd barely shrinks,
    #: where compressing costs far more time than it saves bytes (``frames``).
    stored: bool = False


def _wire(*names: str) -> frozenset[np.dtype]:
    return frozenset(WIRE_DTYPES[name] for name in names)


_INTEGER_WIRE = _wire("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64")


def _token_ids_ok(arr: np.ndarray, limits: DecodeLimits) -> bool:
    if not arr.size:
        return True
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        return False
    return limits.vocab_size is None or int(arr.max()) < limits.vocab_size


def _logprobs_ok(arr: np.ndarray, limits: DecodeLimits) -> bool:
    return not arr.size or (math.isfinite(arr.min()) and math.isfinite(arr.max()))


def _versions_ok(arr: np.ndarray, limits: DecodeLimits) -> bool:
    return not arr.size or arr.dtype.kind != "i" or int(arr.min()) >= 0


def _mask_ok(arr: np.ndarray, limits: DecodeLimits) -> bool:
    # Both mask dtypes are one byte: 0 and 1 are the only values, also for ``bool``
    # (numpy would read any other byte as True).
    return not arr.size or int(np.maximum.reduce(arr.view(np.uint8), axis=None)) <= 1


TOKEN_IDS = ArrayKind(
    "token_ids",
    _INTEGER_WIRE,
    narrow_unsigned,
    _token_ids_ok,
    lambda dtype, limits: dtype.kind == "i" or limits.vocab_size is not None,
)
LOGPROBS = ArrayKind(
    "logprobs",
    _wire("float16", "float32", "float64"),
    unchanged,
    _logprobs_ok,
    lambda dtype, limits: True,
    # Float32 log-probs shrink ≈ 8% at zstd level 1 for ≈ 45% of the codec's zstd time
    # (docs/benchmarks.md, codec section): they travel stored.
    stored=True,
)
VERSIONS = ArrayKind(
    "versions",
    _INTEGER_WIRE,
    narrow_unsigned,
    _versions_ok,
    lambda dtype, limits: dtype.kind == "i",
)
MASK = ArrayKind("mask", _wire("bool", "uint8"), unchanged, _mask_ok, lambda dtype, limits: True)


def _array_type(
    validator: Callable[[Any, ValidationInfo], np.ndarray],
    kind: ArrayKind,
    item_schema: dict[str, str],
) -> Any:
    return Annotated[
        np.ndarray,
        PlainValidator(validator),
        PlainSerializer(_serialize),
        WithJsonSchema({"type": "array", "items": item_schema}),
        kind,
    ]


#: Token ids (1-D, non-negative integers). Narrowed to uint8/16/32 on the wire.
TokenIdArray = _array_type(validate_token_ids, TOKEN_IDS, {"type": "integer"})
#: Natural-log probabilities (1-D float16/32/64, finite). Travel at their own precision.
LogProbArray = _array_type(validate_logprobs, LOGPROBS, {"type": "number"})
#: Weight version of each token (1-D, non-negative integers). Narrowed like token ids.
VersionArray = _array_type(validate_versions, VERSIONS, {"type": "integer"})
#: Loss mask (1-D bool, or uint8 of 0/1): 1 = a policy-generated token that is trained on.
MaskArray = _array_type(validate_mask, MASK, {"type": "boolean"})
