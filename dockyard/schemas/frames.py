"""zstd framing with bounded decompression.

python-zstandard's one-shot ``decompress`` allocates whatever size a frame *declares* and ignores
``max_output_size`` (a 16 KB frame can become 512 MiB), so the declared size is checked against
the budget first; a frame without a declared size is streamed and stopped at the budget.
Compressor and decompressor contexts are reused per thread (they are not thread-safe).
"""

from __future__ import annotations

import threading

import zstandard

from dockyard.schemas.errors import CodecError, ReasonCode

#: Level 1: for rollouts, level 3 gains ~4% in ratio but costs ~35-50% of the encode+decode
#: throughput, so level 1 has the better ratio × speed (docs/benchmarks.md, codec section).
ZSTD_LEVEL = 1
_STREAM_CHUNK = 1 << 20

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    compressors: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if compressors is None:
        compressors = _local.compressors = {}
    compressor = compressors.get(level)
    if compressor is None:
        # Content size is written so decoders can bound memory before decompressing; the
        # content checksum catches corruption at rest (replay reads streams months later).
        compressor = zstandard.ZstdCompressor(
            level=level, write_content_size=True, write_checksum=True
        )
        compressors[level] = compressor
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


def decompress_bounded(frame: bytes, max_output: int) -> bytes:
    """The content of exactly one zstd frame, refusing before allocating past ``max_output``."""
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise CodecError(ReasonCode.CORRUPT_FRAME, f"not a zstd frame: {exc}") from exc
    if params.dict_id != 0:
        raise CodecError(ReasonCode.CORRUPT_FRAME, "frames compressed with a dictionary")
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


def _stream_with_budget(frame: bytes, max_output: int) -> bytes:
    # read_across_frames=True: trailing garbage fails in zstd; a trailing second frame is
    # concatenated and then refused by the msgpack layer as trailing data.
    chunks: list[bytes] = []
    total = 0
    try:
        with _decompressor().stream_reader(frame, read_across_frames=True) as reader:
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
