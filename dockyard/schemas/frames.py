"""zstd framing with bounded decompression.

python-zstandard's one-shot ``decompress`` allocates whatever size a frame *declares* and ignores
``max_output_size`` (a 16 KB frame can become 512 MiB), so the declared size is checked against
the budget first; a frame without a declared size is streamed and stopped at the budget.
Compressor and decompressor contexts are reused per thread (they are not thread-safe).

The encoder may end a frame with *stored* content (:func:`compress_with_stored_tail`): bytes
that entropy coding barely shrinks (float32 log-probs: ≈ 8% at level 1, for about half of the
codec's zstd time) travel in zstd's raw blocks, which a decoder copies. It is still one standard
zstd frame (RFC 8878), so every zstd decoder reads it, this package's older ones included.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import xxhash
import zstandard
from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

from dockyard.schemas.errors import CodecError, ReasonCode

#: Level 1: for rollouts, level 3 gains ~4% in ratio but costs ~35-50% of the encode+decode
#: throughput, so level 1 has the better ratio × speed (docs/benchmarks.md, codec section).
ZSTD_LEVEL = 1
_STREAM_CHUNK = 1 << 20

_local = threading.local()


def _compressor(level: int, *, bare: bool = False) -> zstandard.ZstdCompressor:
    """This thread's compressor for ``level``: by default one whose frames declare their
    content size (decoders bound memory before decompressing) and carry a content checksum
    (replay reads streams months later); ``bare`` frames have neither
    (``compress_with_stored_tail`` writes its own header)."""
    compressors: dict[tuple[int, bool], zstandard.ZstdCompressor] | None = getattr(
        _local, "compressors", None
    )
    if compressors is None:
        compressors = _local.compressors = {}
    compressor = compressors.get((level, bare))
    if compressor is None:
        compressor = compressors[(level, bare)] = zstandard.ZstdCompressor(
            level=level,
            write_content_size=not bare,
            write_checksum=not bare,
            write_dict_id=not bare,
        )
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = zstandard.ZstdDecompressor()
        _local.decompressor = decompressor
    return decompressor


def compress(content: bytes, level: int = ZSTD_LEVEL) -> bytes:
    """One zstd frame that declares its content size and carries a checksum."""
    return _compressor(level).compress(content)


_MAGIC = b"\x28\xb5\x2f\xfd"
#: Frame_Header_Descriptor bits (RFC 8878 §3.1.1.1.1).
_CHECKSUM_FLAG = 0x04
_FCS_4_BYTES = 2 << 6
_FCS_8_BYTES = 3 << 6
_BLOCK_MAX = 128 * 1024
#: Window_Descriptor of a 128 KiB window (exponent 7: 2**(10 + 7)): raw blocks may be that big.
_WINDOW_128K = 7 << 3
_RAW, _RLE, _COMPRESSED = 0, 1, 2


def compress_with_stored_tail(
    head: bytes, tail: Sequence[Buffer], tail_nbytes: int, level: int = ZSTD_LEVEL
) -> bytes:
    """One zstd frame whose content is ``head`` (compressed at ``level``) followed by the
    buffers of ``tail`` (``tail_nbytes`` in all) in raw blocks; content size and checksum
    declared as :func:`compress` does.

    libzstd cannot switch a frame to raw blocks part-way, so ``head`` is compressed as a frame
    of its own (no size, no checksum) and its blocks are carried into a frame header written
    here. That is sound because raw blocks come *after* every compressed block: they change no
    decoder state that a compressed block relies on (repeat offsets, entropy tables).
    """
    views = [memoryview(part).cast("B") for part in tail]
    held = sum(len(view) for view in views)
    if held != tail_nbytes:  # a wrong count would write a frame no decoder accepts
        raise ValueError(f"the stored tail holds {held} bytes, not {tail_nbytes}")
    if not tail_nbytes:
        return compress(head, level)
    blocks = _blocks_of(_compressor(level, bare=True).compress(head))
    if blocks is None:  # not the frame shape expected of libzstd: the plain way is always right
        return compress(b"".join((head, *views)), level)
    window, compressed = blocks
    total = len(head) + tail_nbytes
    checksum = xxhash.xxh64(head)
    parts: list[Buffer] = [
        _MAGIC,
        bytes(((_FCS_4_BYTES if total < 1 << 32 else _FCS_8_BYTES) | _CHECKSUM_FLAG, window)),
        total.to_bytes(4 if total < 1 << 32 else 8, "little"),
        *compressed,
    ]
    remaining = tail_nbytes
    block_left = 0
    for view in views:
        checksum.update(view)
        position = 0
        while position < len(view):
            if not block_left:
                block_left = min(_BLOCK_MAX, remaining)
                remaining -= block_left
                parts.append(_block_header(_RAW, block_left, last=not remaining))
            taken = min(block_left, len(view) - position)
            parts.append(view[position : position + taken])
            position += taken
            block_left -= taken
    parts.append((checksum.intdigest() & 0xFFFFFFFF).to_bytes(4, "little"))
    return b"".join(parts)


def _block_header(block_type: int, size: int, *, last: bool) -> bytes:
    return ((size << 3) | (block_type << 1) | last).to_bytes(3, "little")


def _blocks_of(frame: bytes) -> tuple[int, list[Buffer]] | None:
    """The window descriptor (at least 128 KiB) and the blocks of a bare frame (written by
    ``_compressor(level, bare=True)``), its last block no longer marked last; None if it is not
    shaped like one (a header with a window descriptor only, no checksum)."""
    if len(frame) < 9 or frame[:4] != _MAGIC or frame[4] != 0:
        return None
    window = frame[5]
    exponent, mantissa = window >> 3, window & 7
    base = 1 << (10 + exponent)
    if base + (base >> 3) * mantissa < _BLOCK_MAX:
        window = _WINDOW_128K  # a bigger window than the blocks use is always valid
    view = memoryview(frame)
    position = 6
    while position + 3 <= len(frame):
        header = int.from_bytes(view[position : position + 3], "little")
        block_type, size = (header >> 1) & 3, header >> 3
        end = position + 3 + (1 if block_type == _RLE else size)
        if block_type > _COMPRESSED or end > len(frame):
            return None
        if header & 1:
            if end != len(frame):
                return None
            if block_type == _RAW and size == 0:  # libzstd's empty closing block: not needed
                return window, [view[6:position]]
            return window, [
                view[6:position],
                _block_header(block_type, size, last=False),
                view[position + 3 : end],
            ]
        position = end
    return None


def decompress_bounded(frame: bytes, max_output: int) -> bytes:
    """The content of exactly one zstd frame, refusing before allocating past ``max_output``."""
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(ReasonCode.CORRUPT_FRAME, f"not a zstd frame: {exc}") from exc
    if params.dict_id != 0:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "frames compressed with a dictionary")
    end = _frame_end(frame, params.has_checksum)
    if end != len(frame):
        raise CodecError(
            ReasonCode.CORRUPT_FRAME,
            f"{len(frame) - end} bytes after the zstd frame (a payload is exactly one frame)",
        )
    declared = params.content_size
    if declared == zstandard.CONTENTSIZE_UNKNOWN:
        return _stream_with_budget(frame, max_output)
    if declared > max_output:
        raise CodecError(
            ReasonCode.DECOMPRESSED_TOO_LARGE,
            f"frame declares {declared} bytes, the limit is {max_output}",
        )
    try:
        # allow_extra_data=False: anything after the frame is corruption, not ignored.
        return _decompressor().decompress(frame, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise CodecError(ReasonCode.CORRUPT_FRAME, f"zstd: {exc}") from exc


def _frame_end(frame: bytes, has_checksum: bool) -> int:
    """Where the zstd frame that starts ``frame`` ends (RFC 8878 §3.1.1: header, blocks up to
    the one marked last, then the optional 4-byte checksum), found from the block headers
    alone; CORRUPT_FRAME when the blocks run past the bytes.

    libzstd's streaming reader (a frame that does not declare its size) reads one frame and says
    nothing of what follows, and python-zstandard's one-shot ``decompress`` with
    ``allow_extra_data=False`` returns an empty first frame without looking further; so "exactly
    one frame, nothing after it" is checked here, for every payload: a second frame (also an
    empty or skippable one, or the rest of a message split over two frames) is refused, not
    read on into. It costs ≈ 1 µs per message (a few block headers).
    """
    try:
        position = zstandard.frame_header_size(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(ReasonCode.CORRUPT_FRAME, f"zstd frame header: {exc}") from exc
    view = memoryview(frame)
    size = len(frame)
    while True:
        if position + 3 > size:
            raise CodecError(ReasonCode.CORRUPT_FRAME, "the zstd frame ends inside a block")
        header = int.from_bytes(view[position : position + 3], "little")
        block_type = (header >> 1) & 3
        if block_type > _COMPRESSED:
            raise CodecError(ReasonCode.CORRUPT_FRAME, "a zstd block of the reserved type")
        position += 3 + (1 if block_type == _RLE else header >> 3)
        if header & 1:
            break
    position += 4 if has_checksum else 0
    if position > size:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "the zstd frame ends inside a block")
    return position


def _stream_with_budget(frame: bytes, max_output: int) -> bytes:
    # The frame is known to be the only one (``_frame_end``): nothing is read past it.
    chunks: list[bytes] = []
    total = 0
    try:
        with _decompressor().stream_reader(frame, read_across_frames=False) as reader:
            while True:
                chunk = reader.read(min(_STREAM_CHUNK, max_output - total + 1))
                if not chunk:
                    break
                total += len(chunk)
                if total > max_output:
                    raise CodecError(
                        ReasonCode.DECOMPRESSED_TOO_LARGE,
                        f"frame without a declared size expands past the limit of {max_output}",
                    )
                chunks.append(chunk)
    except zstandard.ZstdError as exc:
        raise CodecError(ReasonCode.CORRUPT_FRAME, f"zstd: {exc}") from exc
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
