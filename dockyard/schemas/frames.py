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
from dataclasses import dataclass

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


#: The largest Window_Size a frame may ask for: libzstd's default streaming limit (2**27), the
#: window of its highest standard level. RFC 8878 lets a decoder set its own limit (it
#: recommends supporting at least 8 MiB); this one is stated in docs/wire-format.md.
MAX_WINDOW = 1 << 27
#: Bytes of the Dictionary_ID field by Dictionary_ID_flag, of the Frame_Content_Size field by
#: Frame_Content_Size_flag (flag 0: one byte in a single-segment frame, else none).
_DICT_ID_BYTES = (0, 1, 2, 4)
_FCS_BYTES = (0, 2, 4, 8)
_RESERVED_BIT = 0x08
_SINGLE_SEGMENT = 0x20


@dataclass(frozen=True, slots=True)
class FrameHeader:
    """A zstd frame header as RFC 8878 §3.1.1.1 defines it, read here rather than by libzstd:
    libzstd reads a declared content size of 2**64 − 1 as "none declared" (its sentinel), so
    such a frame would be streamed unchecked instead of refused for its size."""

    #: Bytes of the header, magic number included: where the first block starts.
    size: int
    #: The Frame_Content_Size, or None when the header has no such field.
    content_size: int | None
    #: Window_Size: from the Window_Descriptor, or the content size in a single-segment frame.
    window_size: int
    single_segment: bool
    has_checksum: bool
    dictionary_id: int


def read_frame_header(frame: bytes) -> FrameHeader:
    """The header of the zstd frame that starts ``frame``; CORRUPT_FRAME when there is none
    (another magic number, a skippable frame, too few bytes, the reserved bit set)."""
    if len(frame) < 5 or frame[:4] != _MAGIC:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "not a zstd frame (RFC 8878 magic number)")
    descriptor = frame[4]
    if descriptor & _RESERVED_BIT:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "the zstd frame header's reserved bit is set")
    single_segment = bool(descriptor & _SINGLE_SEGMENT)
    fcs_flag = descriptor >> 6
    fcs_bytes = 1 if fcs_flag == 0 and single_segment else _FCS_BYTES[fcs_flag]
    dict_bytes = _DICT_ID_BYTES[descriptor & 3]
    position = 5
    size = position + (not single_segment) + dict_bytes + fcs_bytes
    if len(frame) < size:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "the zstd frame header is cut short")
    window_size = 0
    if not single_segment:
        exponent, mantissa = frame[position] >> 3, frame[position] & 7
        base = 1 << (10 + exponent)
        window_size = base + (base >> 3) * mantissa
        position += 1
    dictionary_id = int.from_bytes(frame[position : position + dict_bytes], "little")
    position += dict_bytes
    content_size: int | None = None
    if fcs_bytes:
        content_size = int.from_bytes(frame[position : position + fcs_bytes], "little")
        content_size += 256 if fcs_bytes == 2 else 0  # the 2-byte field is offset by 256
    if single_segment:
        window_size = content_size or 0
    return FrameHeader(
        size=size,
        content_size=content_size,
        window_size=window_size,
        single_segment=single_segment,
        has_checksum=bool(descriptor & _CHECKSUM_FLAG),
        dictionary_id=dictionary_id,
    )


def decompress_bounded(frame: bytes, max_output: int) -> bytes:
    """The content of exactly one zstd frame, refusing before allocating past ``max_output``.

    Checked in this order (docs/wire-format.md, "Compression"): the header, the blocks (exactly
    one frame, each block within the RFC's maximum), the declared size against the limit, then
    the content (libzstd: blocks, checksum), which must be as long as declared."""
    header = read_frame_header(frame)
    if header.dictionary_id != 0:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "frames compressed with a dictionary")
    if not header.single_segment and header.window_size > MAX_WINDOW:
        raise CodecError(
            ReasonCode.CORRUPT_FRAME,
            f"the zstd frame asks for a window of {header.window_size} bytes, "
            f"more than the {MAX_WINDOW} a decoder must accept",
        )
    end = _frame_end(frame, header)
    if end != len(frame):
        raise CodecError(
            ReasonCode.CORRUPT_FRAME,
            f"{len(frame) - end} bytes after the zstd frame (a payload is exactly one frame)",
        )
    declared = header.content_size
    if declared is None:
        return _stream_with_budget(frame, max_output)
    if declared > max_output:
        raise CodecError(
            ReasonCode.DECOMPRESSED_TOO_LARGE,
            f"frame declares {declared} bytes, the limit is {max_output}",
        )
    if declared == zstandard.CONTENTSIZE_UNKNOWN:
        # Only under a limit of 16 EiB: libzstd would take this size for "unknown" and not hold
        # the content to it, so it is read under the budget and held to it here.
        content = _stream_with_budget(frame, max_output)
    else:
        try:
            # allow_extra_data=False: anything after the frame is corruption, not ignored.
            content = _decompressor().decompress(frame, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise CodecError(ReasonCode.CORRUPT_FRAME, f"zstd: {exc}") from exc
    if len(content) != declared:
        raise CodecError(
            ReasonCode.CORRUPT_FRAME,
            f"the zstd frame declares {declared} bytes and holds {len(content)}",
        )
    return content


def decompress_declared(frame: bytes, size: int) -> bytes:
    """The content of one zstd frame that declares exactly ``size`` bytes (a weight patch's
    arrays, whose sizes the patch states): a frame declaring another size, or none, is
    refused before it is decompressed."""
    declared = read_frame_header(frame).content_size
    if declared != size:
        said = "no content size" if declared is None else f"{declared} bytes"
        raise CodecError(
            ReasonCode.CORRUPT_FRAME, f"the zstd frame declares {said}, not the {size} expected"
        )
    return decompress_bounded(frame, size)


def _frame_end(frame: bytes, header: FrameHeader) -> int:
    """Where the zstd frame that starts ``frame`` ends (RFC 8878 §3.1.1: header, blocks up to
    the one marked last, then the optional 4-byte checksum), found from the block headers
    alone; CORRUPT_FRAME when the blocks run past the bytes, or a block is of the reserved type
    or bigger than Block_Maximum_Size (the smaller of the window and 128 KiB, §3.1.1.2.4:
    libzstd's one-shot reader does not check it, its streaming reader does).

    libzstd's streaming reader (a frame that does not declare its size) reads one frame and says
    nothing of what follows, and python-zstandard's one-shot ``decompress`` with
    ``allow_extra_data=False`` returns an empty first frame without looking further; so "exactly
    one frame, nothing after it" is checked here, for every payload: a second frame (also an
    empty or skippable one, or the rest of a message split over two frames) is refused, not
    read on into. It costs ≈ 1 µs per message (a few block headers).
    """
    position = header.size
    block_max = min(header.window_size, _BLOCK_MAX)
    view = memoryview(frame)
    size = len(frame)
    while True:
        if position + 3 > size:
            raise CodecError(ReasonCode.CORRUPT_FRAME, "the zstd frame ends inside a block")
        block = int.from_bytes(view[position : position + 3], "little")
        block_type, block_size = (block >> 1) & 3, block >> 3
        if block_type > _COMPRESSED:
            raise CodecError(ReasonCode.CORRUPT_FRAME, "a zstd block of the reserved type")
        if block_size > block_max:
            raise CodecError(
                ReasonCode.CORRUPT_FRAME,
                f"a zstd block of {block_size} bytes, more than the frame's maximum of "
                f"{block_max} (RFC 8878: the smaller of the window and 128 KiB)",
            )
        position += 3 + (1 if block_type == _RLE else block_size)
        if block & 1:
            break
    position += 4 if header.has_checksum else 0
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
