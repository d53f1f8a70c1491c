"""Frames with a stored tail: one standard zstd frame, readable by every zstd decoder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zstandard
from schema_factories import make_scored

from dockyard.schemas import CodecError, ReasonCode, decode, encode
from dockyard.schemas.frames import (
    compress,
    compress_with_stored_tail,
    decompress_bounded,
)
from dockyard.schemas.layout import lay_out

BLOCK = 128 * 1024


def _blocks(frame: bytes) -> list[tuple[int, int, bool]]:
    """(type, size, last) of every block of a frame (RFC 8878), by walking the headers."""
    header_size = zstandard.frame_header_size(frame)
    position, blocks = header_size, []
    while True:
        header = int.from_bytes(frame[position : position + 3], "little")
        block_type, size, last = (header >> 1) & 3, header >> 3, bool(header & 1)
        blocks.append((block_type, size, last))
        position += 3 + (1 if block_type == 1 else size)
        if last:
            break
    params = zstandard.get_frame_parameters(frame)
    assert position + (4 if params.has_checksum else 0) == len(frame)
    return blocks


def _tail_parts(rng: np.random.Generator, sizes: list[int]) -> list[object]:
    """Buffers of the kinds the layout hands over: arrays of several dtypes and padding."""
    parts: list[object] = []
    for index, size in enumerate(sizes):
        if index % 3 == 0:
            parts.append(rng.standard_normal(size // 4).astype(np.float32))
        elif index % 3 == 1:
            parts.append(bytes(size))
        else:
            parts.append(rng.integers(0, 2, size).astype(np.bool_))
    return parts


@pytest.mark.parametrize(
    ("head_size", "tail_sizes"),
    [
        (1, [4]),
        (100, [7, 1, 4000]),
        (70_000, [BLOCK * 4]),  # whole blocks exactly
        (300_000, [BLOCK - 4, 8, 12, BLOCK * 2 + 3]),  # blocks that span buffers
        (5, [BLOCK * 3 + 1]),  # a tiny compressed part: the window is raised to 128 KiB
    ],
)
def test_stored_tail_frames_decode_to_head_then_tail(head_size: int, tail_sizes: list[int]) -> None:
    rng = np.random.default_rng(head_size)
    head = rng.integers(0, 40, head_size, dtype=np.uint8).tobytes()  # compressible
    tail = _tail_parts(rng, tail_sizes)
    tail_bytes = b"".join(memoryview(part).cast("B") for part in tail)
    frame = compress_with_stored_tail(head, tail, len(tail_bytes))
    content = head + tail_bytes

    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == len(content) and params.has_checksum
    assert decompress_bounded(frame, len(content)) == content
    # Streaming decoders (which keep a window instead of the whole output) read it too.
    with zstandard.ZstdDecompressor().stream_reader(frame) as reader:
        assert reader.read() == content
    blocks = _blocks(frame)
    stored = [size for block_type, size, _ in blocks if block_type == 0]
    assert sum(stored) >= len(tail_bytes) and max(stored) <= BLOCK
    assert blocks[-1][0] == 0 and [last for *_, last in blocks].count(True) == 1


def test_without_a_tail_the_frame_is_the_plain_one() -> None:
    assert compress_with_stored_tail(b"x" * 1000, [], 0) == compress(b"x" * 1000)


@pytest.mark.parametrize(
    ("tail", "announced"),
    [([b"abc"], 10), ([b"abc", b"defg"], 3), ([b"abc"], 0)],
    ids=["shorter", "longer", "announced-empty"],
)
def test_a_tail_of_another_size_than_announced_is_a_programming_error(
    tail: list[bytes], announced: int
) -> None:
    with pytest.raises(ValueError, match="stored tail holds"):
        compress_with_stored_tail(b"head", tail, announced)


def test_corrupting_a_stored_byte_fails_the_checksum() -> None:
    encoded = encode(make_scored(num_samples=4, length=512))
    frame = bytearray(encoded.payload)
    frame[-100] ^= 0x01  # inside the stored log-probs, which zstd copies without looking
    with pytest.raises(CodecError) as refused:
        decode(encoded.headers, bytes(frame))
    assert refused.value.reason is ReasonCode.CORRUPT_FRAME


def test_log_probs_travel_stored_and_the_rest_compressed() -> None:
    message = make_scored(num_samples=4, length=4096)
    _, laid_out = lay_out(message)
    stored = b"".join(memoryview(part).cast("B") for part in laid_out.stored)
    # Every log-prob array (the samples' column and the teachers'), nothing else.
    logprobs = [s.behaviour_logprobs for s in message.rollout.samples] + [
        score.teacher_logprobs for score in message.scores if score.teacher_logprobs is not None
    ]
    assert len(stored) >= sum(arr.nbytes for arr in logprobs)
    assert len(stored) < sum(arr.nbytes for arr in logprobs) + 8 * len(logprobs) + 8
    for arr in logprobs:
        assert arr.astype("<f4").tobytes() in stored
    payload = encode(message).payload
    assert _blocks(payload)[-1][0] == 0  # the frame ends with raw blocks
    assert decode(None, payload) == message


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd command is not installed")
def test_the_zstd_command_line_tool_reads_the_frame(tmp_path: Path) -> None:
    # Another implementation of the format: what a decoder in another language would see.
    encoded = encode(make_scored(num_samples=8, length=20_000))
    path = tmp_path / "message.zst"
    path.write_bytes(encoded.payload)
    result = subprocess.run(
        ["zstd", "-d", "-c", str(path)], capture_output=True, check=True, timeout=60
    )
    assert result.stdout == zstandard.ZstdDecompressor().decompress(encoded.payload)


def test_an_unexpected_libzstd_frame_shape_falls_back_to_the_plain_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # If a libzstd release wrote bare frames differently (a checksum, a content size), the
    # stored tail is not worth a wrong frame: everything is compressed the plain way.
    from dockyard.schemas import frames

    assert frames._blocks_of(b"\x28\xb5\x2f\xfd\x04" + bytes(8)) is None  # checksum flag set
    assert frames._blocks_of(b"not a zstd frame at all") is None
    monkeypatch.setattr(frames, "_blocks_of", lambda frame: None)
    tail = [np.arange(1000, dtype=np.float32)]
    frame = compress_with_stored_tail(b"head" * 100, tail, 4000)
    assert frame == compress(b"head" * 100 + tail[0].tobytes())
