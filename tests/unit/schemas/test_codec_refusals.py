"""A corpus of malformed payloads: each refused with the right reason, fast, in little memory."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
import xxhash
import zstandard
from schema_factories import (
    craft,
    make_prompt_group,
    make_rollout,
    make_sample,
    make_scored,
    make_weight_version,
    repack,
    unpack_payload,
)

from dockyard.schemas import (
    HEADER_CODEC,
    HEADER_SCHEMA,
    HEADER_SCHEMA_VERSION,
    CodecError,
    DecodeLimits,
    ReasonCode,
    Rollout,
    WeightVersion,
    decode,
    encode,
)
from dockyard.schemas.frames import decompress_bounded

MiB = 1024 * 1024


def refusal(payload: bytes, headers: dict[str, str] | None = None, **kwargs: Any) -> CodecError:
    """Decode ``payload`` expecting a refusal; also bound its time and Python allocations."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(CodecError) as caught:
            decode(headers, payload, **kwargs)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0, f"refusal took {elapsed:.2f} s"
    limits: DecodeLimits = kwargs.get("limits", DecodeLimits())
    budget = min(limits.max_decompressed_bytes, 16 * MiB) + 2 * len(payload) + 2 * MiB
    assert peak < budget, f"refusal allocated {peak / MiB:.1f} MiB"
    return caught.value


def mutated(message: Any, change: Callable[[dict[str, Any]], None]) -> bytes:
    envelope = unpack_payload(encode(message).payload)
    change(envelope)
    return repack(envelope)


def sample_columns(envelope: dict[str, Any]) -> dict[str, Any]:
    """The samples' columns (schema 3.0: one list or array descriptor per field)."""
    return envelope["meta"]["samples"]


# ----------------------------------------------------------------------------- frames


def test_payload_over_the_compressed_limit_is_refused_before_anything_else() -> None:
    payload = encode(make_rollout()).payload
    error = refusal(payload, limits=DecodeLimits(max_compressed_bytes=len(payload) - 1))
    assert error.reason is ReasonCode.PAYLOAD_TOO_LARGE


@pytest.mark.parametrize("cut", [0, 3, 10, -1, -5])
def test_truncated_frames(cut: int) -> None:
    payload = encode(make_rollout()).payload
    truncated = payload[:cut] if cut >= 0 else payload[: len(payload) + cut]
    assert refusal(truncated).reason is ReasonCode.CORRUPT_FRAME


def test_not_a_zstd_frame() -> None:
    assert refusal(b"{'not': 'zstd'}").reason is ReasonCode.CORRUPT_FRAME


def test_flipped_byte_fails_the_checksum() -> None:
    payload = bytearray(encode(make_rollout(length=256)).payload)
    payload[len(payload) // 2] ^= 0xFF
    assert refusal(bytes(payload)).reason is ReasonCode.CORRUPT_FRAME


@pytest.mark.parametrize("tail", [b"garbage", b"\x28\xb5\x2f\xfd"])
def test_bytes_after_the_frame(tail: bytes) -> None:
    payload = encode(make_rollout()).payload + tail
    assert refusal(payload).reason is ReasonCode.CORRUPT_FRAME


def test_two_frames_are_refused() -> None:
    payload = encode(make_rollout()).payload
    assert refusal(payload + payload).reason is ReasonCode.CORRUPT_FRAME


def _frame_header_declaring(size: int) -> bytes:
    # Magic, descriptor (8-byte content size, single segment), the size, then one RLE block.
    block = (1 | (1 << 1) | (128 * 1024) << 3).to_bytes(3, "little") + b"\x00"
    return b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + size.to_bytes(8, "little") + block


def test_bomb_declaring_a_terabyte_is_refused_before_decompressing() -> None:
    payload = _frame_header_declaring(1 << 40)
    assert zstandard.get_frame_parameters(payload).content_size == 1 << 40
    assert refusal(payload).reason is ReasonCode.DECOMPRESSED_TOO_LARGE


@pytest.fixture(scope="module")
def gigabyte_of_zeros_frame() -> bytes:
    """A valid 1 GiB frame (a few tens of KB compressed), built without holding 1 GiB."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj(size=1 << 30)
    zeros = bytes(4 * MiB)
    frame = b"".join(compressor.compress(zeros) for _ in range(256)) + compressor.flush()
    return frame


def test_real_bomb_with_declared_size_is_refused(gigabyte_of_zeros_frame: bytes) -> None:
    assert len(gigabyte_of_zeros_frame) < 1 * MiB
    error = refusal(gigabyte_of_zeros_frame)
    assert error.reason is ReasonCode.DECOMPRESSED_TOO_LARGE
    assert str(1 << 30) in error.detail


def test_frame_without_declared_size_is_stopped_at_the_budget() -> None:
    streaming = zstandard.ZstdCompressor(level=1).compressobj()
    zeros = bytes(4 * MiB)
    frame = b"".join(streaming.compress(zeros) for _ in range(64)) + streaming.flush()  # 256 MiB
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    error = refusal(frame, limits=DecodeLimits(max_decompressed_bytes=8 * MiB))
    assert error.reason is ReasonCode.DECOMPRESSED_TOO_LARGE


def test_declared_size_just_over_the_limit() -> None:
    payload = encode(make_rollout()).payload
    size = zstandard.get_frame_parameters(payload).content_size
    error = refusal(payload, limits=DecodeLimits(max_decompressed_bytes=size - 1))
    assert error.reason is ReasonCode.DECOMPRESSED_TOO_LARGE


def _hand_made_frame(
    descriptor: int, content_size_field: bytes, content: bytes, window: int = 7 << 3
) -> bytes:
    """One zstd frame written from RFC 8878 §3.1.1: magic, Frame_Header_Descriptor, a
    Window_Descriptor (default 128 KiB: exponent 7, 2**(10 + 7) bytes) unless
    Single_Segment_flag (bit 5) is set, the Frame_Content_Size field as given, ``content`` in
    one raw block (type 0, marked last) and, when Content_Checksum_flag (bit 2) is set, the low
    4 bytes of XXH64(content)."""
    descriptor_byte = b"" if descriptor & 0x20 else bytes([window])
    block = ((len(content) << 3) | 1).to_bytes(3, "little") + content
    checksum = (xxhash.xxh64(content).intdigest() & 0xFFFFFFFF).to_bytes(4, "little")
    return b"".join(
        (
            b"\x28\xb5\x2f\xfd",
            bytes([descriptor]),
            descriptor_byte,
            content_size_field,
            block,
            checksum if descriptor & 0x04 else b"",
        )
    )


#: Frame_Content_Size_flag 3 (an 8-byte field), checksum on; without and with Single_Segment.
_FCS_8 = 0xC4
_FCS_8_SINGLE_SEGMENT = 0xE4
_ALL_ONES = (2**64 - 1).to_bytes(8, "little")


@pytest.mark.parametrize(
    "descriptor", [_FCS_8, _FCS_8_SINGLE_SEGMENT], ids=["windowed", "single-segment"]
)
def test_a_declared_size_of_2_64_minus_1_is_declared_and_above_the_limit(descriptor: int) -> None:
    # RFC 8878: a Frame_Content_Size field, when present, is the content size; 2**64 − 1 is a
    # size like any other (libzstd uses it to mean "unknown"). docs/wire-format.md: a declared
    # size above the limit is decompressed_too_large, before decompressing.
    content = zstandard.ZstdDecompressor().decompress(encode(make_weight_version()).payload)
    error = refusal(_hand_made_frame(descriptor, _ALL_ONES, content))
    assert error.reason is ReasonCode.DECOMPRESSED_TOO_LARGE
    assert str(2**64 - 1) in error.detail


@pytest.mark.parametrize(
    "descriptor", [_FCS_8, _FCS_8_SINGLE_SEGMENT], ids=["windowed", "single-segment"]
)
def test_content_shorter_than_a_declared_2_64_minus_1_is_a_corrupt_frame(descriptor: int) -> None:
    # Under a limit that admits the declared size, the content disagrees with it: corrupt_frame.
    content = zstandard.ZstdDecompressor().decompress(encode(make_weight_version()).payload)
    error = refusal(
        _hand_made_frame(descriptor, _ALL_ONES, content),
        limits=DecodeLimits(max_decompressed_bytes=2**64),
    )
    assert error.reason is ReasonCode.CORRUPT_FRAME


@pytest.mark.parametrize(
    ("descriptor", "field", "declared"),
    [
        (0x24, bytes([200]), 200),  # Single_Segment, FCS flag 0: a 1-byte field
        (0x44, (0).to_bytes(2, "little"), 256),  # FCS flag 1: 2 bytes, value + 256
        (0x44, (1000 - 256).to_bytes(2, "little"), 1000),
        (0x84, (3000).to_bytes(4, "little"), 3000),  # FCS flag 2: 4 bytes
        (0xC4, (70_000).to_bytes(8, "little"), 70_000),  # FCS flag 3: 8 bytes
    ],
    ids=["1-byte", "2-byte-zero", "2-byte", "4-byte", "8-byte"],
)
def test_each_content_size_field_is_read_as_rfc_8878_says(
    descriptor: int, field: bytes, declared: int
) -> None:
    content = bytes(index % 251 for index in range(declared))
    frame = _hand_made_frame(descriptor, field, content)
    assert decompress_bounded(frame, declared) == content
    with pytest.raises(CodecError) as caught:
        decompress_bounded(frame, declared - 1)
    assert caught.value.reason is ReasonCode.DECOMPRESSED_TOO_LARGE


def test_a_frame_without_a_content_size_field_declares_nothing() -> None:
    # FCS flag 0 without Single_Segment: no field; the content is streamed under the budget.
    frame = _hand_made_frame(0x04, b"", bytes(5000))
    assert decompress_bounded(frame, 5000) == bytes(5000)
    with pytest.raises(CodecError) as caught:
        decompress_bounded(frame, 4999)
    assert caught.value.reason is ReasonCode.DECOMPRESSED_TOO_LARGE


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "unsized"])
@pytest.mark.parametrize(
    ("window", "accepted"),
    [
        (17 << 3, True),  # exponent 17: 2**27 = 128 MiB, the largest window accepted
        ((17 << 3) | 1, False),  # mantissa 1: 128 MiB + 16 MiB
        (21 << 3, False),  # 2 GiB
    ],
    ids=["128MiB", "144MiB", "2GiB"],
)
def test_the_largest_window_is_128_mib_whether_or_not_the_size_is_declared(
    window: int, accepted: bool, sized: bool
) -> None:
    # docs/wire-format.md: a Window_Size above 128 MiB is corrupt_frame; the declared size
    # changes nothing (libzstd's one-shot reader takes any window, its streaming one does not).
    descriptor, field = (0x84, (100).to_bytes(4, "little")) if sized else (0x04, b"")
    frame = _hand_made_frame(descriptor, field, bytes(100), window)
    if accepted:
        assert decompress_bounded(frame, 100) == bytes(100)
    else:
        with pytest.raises(CodecError) as caught:
            decompress_bounded(frame, 100)
        assert caught.value.reason is ReasonCode.CORRUPT_FRAME


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "unsized"])
@pytest.mark.parametrize(
    ("window", "block_size", "accepted"),
    [
        (8 << 3, 128 * 1024, True),  # a 256 KiB window: blocks up to 128 KiB
        (8 << 3, 128 * 1024 + 1, False),
        (0, 1024, True),  # a 1 KiB window: blocks up to 1 KiB
        (0, 1025, False),
    ],
    ids=["128KiB-in-256KiB", "128KiB+1-in-256KiB", "1KiB-in-1KiB", "1KiB+1-in-1KiB"],
)
def test_a_block_may_not_exceed_the_smaller_of_the_window_and_128_kib(
    window: int, block_size: int, accepted: bool, sized: bool
) -> None:
    # RFC 8878 §3.1.1.2.4: Block_Maximum_Size is the smaller of Window_Size and 128 KiB.
    descriptor, field = (0x84, block_size.to_bytes(4, "little")) if sized else (0x04, b"")
    frame = _hand_made_frame(descriptor, field, bytes(block_size), window)
    if accepted:
        assert decompress_bounded(frame, block_size) == bytes(block_size)
    else:
        with pytest.raises(CodecError) as caught:
            decompress_bounded(frame, block_size)
        assert caught.value.reason is ReasonCode.CORRUPT_FRAME


def test_the_reserved_descriptor_bit_is_a_corrupt_frame() -> None:
    # RFC 8878 §3.1.1.1.1.4: Reserved_Bit (bit 3) must be 0, and a decoder must check it.
    frame = _hand_made_frame(0x24 | 0x08, bytes([10]), bytes(10))
    assert refusal(frame).reason is ReasonCode.CORRUPT_FRAME


# ----------------------------------------------------------------------------- msgpack


def _zstd(content: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(content)


_HEAD = b"\x83" + b"".join(msgpack.packb(x) for x in ("schema", "rollout", "schema_version", "1.0"))
_HEAD += msgpack.packb("meta")


@pytest.mark.parametrize(
    "content",
    [
        _HEAD + b"\xc1",  # a byte msgpack never uses
        msgpack.packb({"schema": "rollout"})[:-3],  # truncated inside the map
        _HEAD + b"\xdb\xff\xff\xff\xff" + b"x" * 10,  # a str claiming 4 GiB
        _HEAD + b"\x91" * 5000 + b"\xc0",  # nested arrays deeper than the stack limit
        msgpack.packb({"schema": "x"}) + b"\x00",  # bytes after the top-level map
        msgpack.packb({"schema": b"\xff\xfe"}).replace(b"\xc4", b"\xa2", 1),  # invalid UTF-8
    ],
    ids=["reserved", "truncated", "huge-str", "deep", "trailing", "bad-utf8"],
)
def test_bad_msgpack(content: bytes) -> None:
    assert refusal(_zstd(content)).reason is ReasonCode.BAD_MSGPACK


def test_a_map_key_inside_meta_that_is_not_str_is_a_wrong_type() -> None:
    # meta is decoded field by field after the envelope and the version: a key there is a
    # field name, and an integer is the wrong type for one (docs/wire-format.md).
    head = _HEAD.replace(msgpack.packb("1.0"), msgpack.packb("3.0"))
    assert refusal(_zstd(head + b"\x81\x01\xa1x")).reason is ReasonCode.WRONG_TYPE


def test_invalid_utf8_inside_meta_is_found_when_meta_is_decoded() -> None:
    # The envelope checks the content's structure; a str's UTF-8 inside meta is checked when
    # meta is decoded, after the version (docs/wire-format.md, the envelope's rules).
    # A field the message does not have is skipped, its structure checked but not its text.
    bad_text = b"\x81" + msgpack.packb("group_id") + b"\xa2\xff\xfe"
    assert refusal(_zstd(_HEAD + bad_text)).reason is ReasonCode.UNSUPPORTED_VERSION
    head = b"\x83" + b"".join(
        msgpack.packb(x) for x in ("schema", "prompt_group", "schema_version", "1.1", "meta")
    )
    assert refusal(_zstd(head + bad_text)).reason is ReasonCode.BAD_MSGPACK
    unknown = b"\x81" + msgpack.packb("added_later") + b"\xa2\xff\xfe"
    assert refusal(_zstd(head + unknown)).reason is ReasonCode.MISSING_FIELD


@pytest.mark.parametrize(
    "content",
    [
        msgpack.packb([1, 2, 3]),
        b"\x81\x01\xa1x",  # an integer key at the top level
        msgpack.packb({"schema": 3, "schema_version": "1.0", "meta": {}}),
        msgpack.packb({"schema": "rollout", "schema_version": "1.0", "meta": [1]}),
        msgpack.packb({"schema": "rollout", "schema_version": "1.0"}),
        msgpack.packb({"schema": "rollout", "schema_version": "1.0", "meta": {}, "data": 5}),
    ],
    ids=["not-a-map", "int-key", "schema-int", "meta-list", "no-meta", "data-int"],
)
def test_bad_envelope(content: bytes) -> None:
    assert refusal(_zstd(content)).reason is ReasonCode.BAD_ENVELOPE


# ----------------------------------------------------------------------------- identity


def test_unknown_schema() -> None:
    assert refusal(craft({}, schema="rollout_v9")).reason is ReasonCode.UNKNOWN_SCHEMA


@pytest.mark.parametrize("version", ["2.0", "0.9", "1", "v1.0", "1.0.0", ""])
def test_unsupported_versions(version: str) -> None:
    meta = unpack_payload(encode(make_weight_version()).payload)["meta"]
    payload = craft(meta, schema="weight_version", version=version)
    error = refusal(payload)
    assert error.reason is ReasonCode.UNSUPPORTED_VERSION


def test_header_and_payload_disagree() -> None:
    encoded = encode(make_weight_version())
    headers = {**encoded.headers, HEADER_SCHEMA: "rollout"}
    assert refusal(encoded.payload, headers).reason is ReasonCode.HEADER_MISMATCH
    headers = {**encoded.headers, HEADER_SCHEMA_VERSION: "1.1"}
    assert refusal(encoded.payload, headers).reason is ReasonCode.HEADER_MISMATCH


def test_unsupported_codec_header() -> None:
    encoded = encode(make_weight_version())
    headers = {**encoded.headers, HEADER_CODEC: "json"}
    assert refusal(encoded.payload, headers).reason is ReasonCode.UNSUPPORTED_CODEC


def test_unexpected_schema_is_refused_from_the_header_before_decompressing() -> None:
    headers = {HEADER_SCHEMA: "weight_version"}
    error = refusal(b"not even zstd", headers, expected=Rollout)
    assert error.reason is ReasonCode.UNEXPECTED_SCHEMA
    payload = encode(make_weight_version()).payload
    assert refusal(payload, expected=Rollout).reason is ReasonCode.UNEXPECTED_SCHEMA
    assert decode(None, payload, expected=WeightVersion) == make_weight_version()


# ----------------------------------------------------------------------------- fields


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        node = envelope["meta"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _delete(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        node = envelope["meta"]
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_set(["group", "num_generations"], "two"), ReasonCode.WRONG_TYPE),
        (_set(["group", "group_id"], 17), ReasonCode.WRONG_TYPE),
        (_set(["samples"], [{}]), ReasonCode.WRONG_TYPE),
        (_set(["samples", "sampling"], [1.0]), ReasonCode.WRONG_TYPE),
        (_set(["group", "prompt_token_ids"], [1, 2, 3]), ReasonCode.WRONG_TYPE),
        (_delete(["group", "trace_id"]), ReasonCode.MISSING_FIELD),
        (_delete(["samples", "behaviour_logprobs"]), ReasonCode.MISSING_FIELD),
        (_set(["group", "group_id"], "has space"), ReasonCode.INVALID_FIELD),
        (_set(["samples", "finish_reason", 0], "bored"), ReasonCode.INVALID_FIELD),
        (_set(["samples", "sampling", "top_p", 0], 1.5), ReasonCode.INVALID_FIELD),
        (_set(["group", "num_generations"], 3), ReasonCode.LENGTH_MISMATCH),
        (_set(["samples", "worker_id"], ["worker-a"]), ReasonCode.LENGTH_MISMATCH),
        (_set(["samples", "response_lengths"], [8, 7]), ReasonCode.LENGTH_MISMATCH),
        (_set(["samples", "prompt_shared"], False), ReasonCode.LENGTH_MISMATCH),
        (_set(["samples", "worker_id", 1], ""), ReasonCode.INVALID_FIELD),
        (
            _set(["samples", "segments", 0], [{"role": "tool", "start": 0, "end": 9}]),
            ReasonCode.LENGTH_MISMATCH,
        ),
        (_set(["samples", "sampling", "temperature", 1], float("inf")), ReasonCode.NON_FINITE),
    ],
    ids=[
        "int-as-str",
        "str-as-int",
        "list-as-map",
        "model-as-list",
        "array-as-list",
        "missing-trace-id",
        "missing-logprobs",
        "bad-group-id",
        "bad-finish-reason",
        "top-p-range",
        "sample-count",
        "short-column",
        "lengths-disagree-with-arrays",
        "shared-prompt-unmarked",
        "empty-worker-id",
        "segment-past-the-response",
        "inf-temperature",
    ],
)
def test_field_refusals(change: Callable[[dict[str, Any]], None], reason: ReasonCode) -> None:
    error = refusal(mutated(make_rollout(), change))
    assert error.reason is reason, error.detail


def _descriptor(field: str, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        sample_columns(envelope)[field].update(changes)

    return change


def _renamed_key(field: str, key: str, new_key: Any) -> Callable[[dict[str, Any]], None]:
    """The descriptor with one of its three keys replaced: still three entries (the decoder
    may not count keys alone)."""

    def change(envelope: dict[str, Any]) -> None:
        descriptor = sample_columns(envelope)[field]
        descriptor[new_key] = descriptor.pop(key)

    return change


def _shortened(field: str) -> Callable[[dict[str, Any]], None]:
    """The field's array cut to its first element (its own bytes: still a valid array)."""

    def change(envelope: dict[str, Any]) -> None:
        descriptor = sample_columns(envelope)[field]
        itemsize = np.dtype(descriptor["dtype"]).itemsize
        descriptor.update(shape=[1], data=[descriptor["data"][0], itemsize])

    return change


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_descriptor("behaviour_logprobs", shape=[7], data=None), ReasonCode.BAD_ARRAY),
        (_descriptor("behaviour_logprobs", dtype="object"), ReasonCode.BAD_ARRAY),
        (_descriptor("behaviour_logprobs", dtype="<U8"), ReasonCode.BAD_ARRAY),
        (_descriptor("behaviour_logprobs", dtype="int32"), ReasonCode.BAD_ARRAY),
        (_descriptor("response_token_ids", dtype="float32"), ReasonCode.BAD_ARRAY),
        (_descriptor("response_token_ids", shape=[2, 4]), ReasonCode.BAD_ARRAY),
        (_descriptor("response_token_ids", shape=[-8]), ReasonCode.BAD_ARRAY),
        (_descriptor("behaviour_logprobs", data=[0, 31]), ReasonCode.BAD_ARRAY),
        (_descriptor("behaviour_logprobs", data=[1 << 40, 32]), ReasonCode.BAD_ARRAY),
        (_descriptor("behaviour_logprobs", extra_key=1), ReasonCode.BAD_ARRAY),
        (_renamed_key("behaviour_logprobs", "data", "range"), ReasonCode.BAD_ARRAY),
        (_renamed_key("response_token_ids", "shape", 1), ReasonCode.BAD_ARRAY),
        (_descriptor("loss_mask", dtype="int16", data=[0, 32]), ReasonCode.BAD_ARRAY),
        (
            _descriptor("behaviour_logprobs", shape=[10**9], data=[0, 4 * 10**9]),
            ReasonCode.ARRAY_TOO_LARGE,
        ),
        (
            _descriptor("behaviour_logprobs", shape=[1 << 40, 1 << 40], data=[0, 0]),
            ReasonCode.ARRAY_TOO_LARGE,
        ),
        (_descriptor("behaviour_logprobs", shape=[4], data=[0, 16]), ReasonCode.LENGTH_MISMATCH),
        (_descriptor("token_weight_versions", shape=[9], data=[0, 9]), ReasonCode.LENGTH_MISMATCH),
        (_shortened("loss_mask"), ReasonCode.LENGTH_MISMATCH),
    ],
    ids=[
        "data-not-a-range",
        "object-dtype",
        "unicode-dtype",
        "int-logprobs",
        "float-token-ids",
        "2d-token-ids",
        "negative-dim",
        "nbytes-disagrees",
        "range-outside-section",
        "unknown-descriptor-key",
        "renamed-descriptor-key",
        "int-descriptor-key",
        "int16-mask",
        "billion-elements",
        "overflowing-shape",
        "short-logprobs",
        "long-versions",
        "short-mask",
    ],
)
def test_array_refusals(change: Callable[[dict[str, Any]], None], reason: ReasonCode) -> None:
    error = refusal(mutated(make_rollout(), change))
    assert error.reason is reason, error.detail


def _poke_logprob(value: float) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        offset, _ = sample_columns(envelope)["behaviour_logprobs"]["data"]
        data = bytearray(envelope["data"])
        # Sample 1's third log-prob: entry 8 + 2 of the column (8 tokens per sample).
        data[offset + 40 : offset + 44] = np.float32(value).tobytes()
        envelope["data"] = bytes(data)

    return change


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logprobs(value: float) -> None:
    error = refusal(mutated(make_rollout(), _poke_logprob(value)))
    assert error.reason is ReasonCode.NON_FINITE
    assert "samples.behaviour_logprobs" in error.detail
    assert "first at entry 10" in error.detail


def test_non_finite_teacher_logprobs_and_rewards() -> None:
    def teacher(envelope: dict[str, Any]) -> None:
        offset, _ = envelope["meta"]["scores"]["teacher_logprobs"]["data"]
        data = bytearray(envelope["data"])
        data[offset : offset + 4] = np.float32("nan").tobytes()
        envelope["data"] = bytes(data)

    assert refusal(mutated(make_scored(), teacher)).reason is ReasonCode.NON_FINITE
    reward = _set(["scores", "reward", 1], float("nan"))
    assert refusal(mutated(make_scored(), reward)).reason is ReasonCode.NON_FINITE


def test_teacher_logprob_length_mismatch() -> None:
    def shorten(envelope: dict[str, Any]) -> None:
        envelope["meta"]["scores"]["teacher_logprobs"].update(shape=[3], data=[0, 12])

    def lengths(envelope: dict[str, Any]) -> None:  # the array agrees; a sample's count not
        envelope["meta"]["scores"]["teacher_lengths"] = [7, 9]

    def one_sided(envelope: dict[str, Any]) -> None:
        envelope["meta"]["scores"]["teacher_lengths"] = None

    def other_side(envelope: dict[str, Any]) -> None:
        envelope["meta"]["scores"]["teacher_logprobs"] = None

    # docs/wire-format.md: the two teacher columns come together; one without the other is a
    # length_mismatch (a count of log-probs that are not there, or log-probs of no sample).
    for change in (shorten, lengths, one_sided, other_side):
        error = refusal(mutated(make_scored(), change))
        assert error.reason is ReasonCode.LENGTH_MISMATCH, error.detail


def test_vocabulary_bound_on_token_ids() -> None:
    rollout = make_rollout()
    top = max(int(s.response_token_ids.max()) for s in rollout.samples)
    payload = encode(rollout).payload
    assert decode(None, payload, limits=DecodeLimits(vocab_size=top + 1)) == rollout
    error = refusal(payload, limits=DecodeLimits(vocab_size=top))
    assert error.reason is ReasonCode.TOKEN_OUT_OF_VOCAB
    assert str(top) in error.detail


def test_negative_token_ids_are_out_of_vocabulary() -> None:
    def negative(envelope: dict[str, Any]) -> None:
        descriptor = sample_columns(envelope)["response_token_ids"]
        offset, _ = descriptor["data"]
        values = np.array([-1] * 8, dtype="<i2").tobytes()
        data = bytearray(envelope["data"])
        data[offset : offset + 16] = values
        envelope["data"] = bytes(data)
        descriptor.update(dtype="int16", shape=[8], data=[offset, 16])
        sample_columns(envelope)["response_lengths"] = [4, 4]
        for name in ("behaviour_logprobs", "token_weight_versions", "loss_mask"):
            column = sample_columns(envelope)[name]
            column["shape"] = [8]
            column["data"][1] //= 2

    assert refusal(mutated(make_rollout(), negative)).reason is ReasonCode.TOKEN_OUT_OF_VOCAB


def test_negative_weight_versions_are_an_invalid_field_not_out_of_vocabulary() -> None:
    # docs/wire-format.md: `token_weight_versions` is an integer array of versions (≥ 0), not
    # token ids: a negative one is invalid_field, and the vocabulary bound does not apply.
    def negative(envelope: dict[str, Any]) -> None:
        descriptor = sample_columns(envelope)["token_weight_versions"]
        offset, _ = descriptor["data"]
        count = descriptor["shape"][0]
        data = bytearray(envelope["data"])
        data[offset : offset + count] = np.full(count, -1, dtype="i1").tobytes()
        envelope["data"] = bytes(data)
        descriptor.update(dtype="int8", data=[offset, count])

    assert refusal(mutated(make_rollout(), negative)).reason is ReasonCode.INVALID_FIELD
    # Versions past the consumer's vocabulary are versions, not out-of-vocabulary tokens.
    group = make_prompt_group(num_generations=1, prompt_token_ids=np.array([1, 2]))
    sample = make_sample(
        0,
        4,
        prompt_token_ids=np.array([1, 2]),
        response_token_ids=np.array([3, 4, 5, 6]),
        token_weight_versions=np.full(4, 1_000),
    )
    rollout = Rollout(group=group, samples=[sample], created_at_unix_s=1.7e9)
    decoded = decode(None, encode(rollout).payload, limits=DecodeLimits(vocab_size=10))
    assert decoded == rollout


def test_uint8_mask_with_values_other_than_0_and_1() -> None:
    def twos(envelope: dict[str, Any]) -> None:
        descriptor = sample_columns(envelope)["loss_mask"]
        offset, _ = descriptor["data"]
        data = bytearray(envelope["data"])
        data[offset : offset + 8] = bytes([2] * 8)
        envelope["data"] = bytes(data)
        descriptor["dtype"] = "uint8"

    assert refusal(mutated(make_rollout(), twos)).reason is ReasonCode.INVALID_FIELD


def test_a_refusal_round_trips_into_a_dead_letter() -> None:
    from dockyard.schemas import DeadLetter

    bad = b"\x00garbage"
    with pytest.raises(CodecError) as caught:
        decode(None, bad)
    letter = DeadLetter(
        original_subject="dockyard.rollouts",
        original_payload=bad,
        stage="scorer",
        reason=caught.value.reason,
        message=caught.value.detail,
    )
    decoded = decode(None, encode(letter).payload, expected=DeadLetter)
    assert decoded.reason == ReasonCode.CORRUPT_FRAME
    assert decoded.original_payload == bad


def iter_reasons() -> Iterator[ReasonCode]:
    yield from ReasonCode


def test_codec_error_pickles_with_its_reason() -> None:
    import pickle

    error = CodecError(ReasonCode.NON_FINITE, "samples.0: NaN")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.detail) == (ReasonCode.NON_FINITE, "samples.0: NaN")
