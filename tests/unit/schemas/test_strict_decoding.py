"""The wire is read strictly (issue 19): exactly one zstd frame, no type coercion, every rule of
docs/wire-format.md enforced by the one decode path with the reason code the page gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import msgspec
import pytest
import zstandard
from schema_factories import (
    make_dead_letter,
    make_prompt_group,
    make_rollout,
    make_scored,
    make_weight_version,
    repack,
    unpack_payload,
)

from dockyard.schemas import CodecError, Message, ReasonCode, decode, encode
from dockyard.schemas.errors import WireError

MESSAGES: dict[str, Callable[[], Message]] = {
    "prompt_group": make_prompt_group,
    "rollout": make_rollout,
    "scored_rollout": make_scored,
    "weight_version": make_weight_version,
    "dead_letter": make_dead_letter,
}


def refused(payload: bytes) -> ReasonCode:
    with pytest.raises(CodecError) as caught:
        decode(None, payload)
    return caught.value.reason


def _content(message: Message) -> bytes:
    return zstandard.ZstdDecompressor().decompress(encode(message).payload)


def _unsized(content: bytes) -> bytes:
    """One frame that does not declare its content size (a decoder streams it)."""
    stream = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    return stream.compress(content) + stream.flush()


#: A skippable frame (RFC 8878 §3.1.2): magic 0x184D2A5?, a 4-byte size, that many bytes.
SKIPPABLE = (0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little") + b"skip"
EMPTY_FRAME = zstandard.ZstdCompressor().compress(b"")


# ----------------------------------------------------------------------------- one frame


@pytest.mark.parametrize("name", sorted(MESSAGES))
@pytest.mark.parametrize("sized", [True, False], ids=["sized", "unsized"])
@pytest.mark.parametrize(
    "tail",
    ["garbage", "second-frame", "empty-frame", "empty-unsized-frame", "skippable-frame", "magic"],
)
def test_no_decode_path_accepts_anything_after_the_frame(name: str, sized: bool, tail: str) -> None:
    content = _content(MESSAGES[name]())
    frame = zstandard.ZstdCompressor().compress(content) if sized else _unsized(content)
    assert decode(None, frame) is not None  # the frame alone is fine
    after = {
        "garbage": b"garbage",
        "second-frame": frame,
        "empty-frame": EMPTY_FRAME,
        "empty-unsized-frame": _unsized(b""),
        "skippable-frame": SKIPPABLE,
        "magic": b"\x28\xb5\x2f\xfd",
    }[tail]
    assert refused(frame + after) is ReasonCode.CORRUPT_FRAME


def test_content_split_over_two_frames_is_refused() -> None:
    content = _content(make_rollout())
    half = len(content) // 2
    for first, second in (
        (_unsized(content[:half]), _unsized(content[half:])),
        (zstandard.ZstdCompressor().compress(content[:half]), _unsized(content[half:])),
    ):
        assert refused(first + second) is ReasonCode.CORRUPT_FRAME


@pytest.mark.parametrize("before", [SKIPPABLE, EMPTY_FRAME], ids=["skippable", "empty"])
def test_a_frame_before_the_message_is_refused(before: bytes) -> None:
    assert refused(before + encode(make_rollout()).payload) is ReasonCode.CORRUPT_FRAME


def test_an_empty_frame_is_not_a_message() -> None:
    # Its content (nothing) is not one msgpack map.
    assert refused(EMPTY_FRAME) is ReasonCode.BAD_MSGPACK
    assert refused(_unsized(b"")) is ReasonCode.BAD_MSGPACK


# ----------------------------------------------------------------------------- envelope


def _mutated(message: Message, change: Callable[[dict[str, Any]], None]) -> bytes:
    envelope = unpack_payload(encode(message).payload)
    change(envelope)
    return repack(envelope)


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        node = envelope
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


@pytest.mark.parametrize("version", ["3.0\n", "1.0\n", " 3.0", "3.0 ", "03.0", "3.00", "+3.0"])
def test_schema_version_is_exactly_major_dot_minor(version: str) -> None:
    # "$" would also match before a trailing newline: the check is anchored at the very end.
    payload = _mutated(make_rollout(), _set(["schema_version"], version))
    assert refused(payload) is ReasonCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize(
    "change",
    [
        _set(["extra_key"], 1),  # the envelope has exactly the documented keys
        _set(["pad"], 0),  # pad is a bin
        _set(["pad"], "  "),
    ],
    ids=["unknown-key", "pad-int", "pad-str"],
)
def test_envelope_keys(change: Callable[[dict[str, Any]], None]) -> None:
    assert refused(_mutated(make_rollout(), change)) is ReasonCode.BAD_ENVELOPE


def _map(pairs: list[tuple[Any, bytes]]) -> bytes:
    """A msgpack map of already packed values (so that a key can be repeated)."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(msgpack.packb(key) + value for key, value in pairs)


def _packed_envelope(schema: str, version: str, meta: bytes, data: bytes = b"") -> bytes:
    pack = msgpack.packb
    entries = [("schema", pack(schema)), ("schema_version", pack(version)), ("meta", meta)]
    entries += [("pad", pack(b"", use_bin_type=True)), ("data", pack(data, use_bin_type=True))]
    return zstandard.ZstdCompressor().compress(_map(entries))


def test_a_repeated_key() -> None:
    """The envelope refuses one; inside ``meta`` the last value counts (docs/wire-format.md)."""
    pack = msgpack.packb
    weights = encode(make_weight_version())
    meta = unpack_payload(weights.payload)["meta"]
    fields = [(key, pack(value)) for key, value in meta.items()]
    schema, version = "weight_version", weights.headers["Dockyard-Schema-Version"]
    repeated = _packed_envelope(schema, version, _map([*fields, ("version", pack(99))]))
    assert decode(None, repeated).version == 99  # type: ignore[attr-defined]
    letter = encode(make_dead_letter())
    meta = unpack_payload(letter.payload)["meta"]
    headers = _map([("a", pack("1")), ("a", pack("2"))])
    fields = [
        (key, headers if key == "original_headers" else pack(value, use_bin_type=True))
        for key, value in meta.items()
    ]
    payload = _packed_envelope(
        "dead_letter", letter.headers["Dockyard-Schema-Version"], _map(fields)
    )
    assert decode(None, payload).original_headers == {"a": "2"}  # type: ignore[attr-defined]
    envelope = _map([("schema", pack(schema)), ("schema", pack(schema))])
    payload = zstandard.ZstdCompressor().compress(envelope)
    assert refused(payload) is ReasonCode.BAD_ENVELOPE


# ----------------------------------------------------------------------------- no coercion

_GROUP = ["meta", "group"]
_SAMPLES = ["meta", "samples"]
_SCORES = ["meta", "scores"]


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (make_rollout, _set([*_SAMPLES, "sampling", "temperature", 0], " 1e0 ")),
        (make_rollout, _set([*_SAMPLES, "sampling", "temperature", 0], "1.0")),
        (make_rollout, _set([*_GROUP, "num_generations"], "2")),
        (make_rollout, _set([*_GROUP, "num_generations"], 2.0)),
        (make_rollout, _set([*_GROUP, "attempt"], 0.0)),
        (make_rollout, _set([*_GROUP, "num_generations"], True)),
        (make_scored, _set([*_SCORES, "reward", 0], True)),
        (make_rollout, _set([*_SAMPLES, "sampling", "top_p", 0], False)),
        (make_rollout, _set([*_SAMPLES, "prompt_shared"], 1)),
        (make_scored, _set([*_SCORES, "invalid_action", 0], 0)),
        (make_scored, _set([*_SCORES, "timed_out", 1], 1)),
        (make_rollout, _set([*_SAMPLES, "sampling", "seed"], [1.0, None])),
        (make_dead_letter, _set(["meta", "original_payload"], "refused bytes")),
        (make_prompt_group, _set(["meta", "images"], ["not an image"])),
        (make_prompt_group, _set(["meta", "prompt_text"], b"What is 2 + 3?")),
        (make_prompt_group, _set(["meta", "group_id"], b"run7-e0-i12")),
        (make_prompt_group, _set(["meta", "extra"], {b"difficulty": 2})),
        (make_prompt_group, _set(["meta", "extra"], {"blob": b"\x00"})),  # JSON has no bin
        (make_dead_letter, _set(["meta", "original_headers"], {b"Nats-Msg-Id": "x"})),
        (make_dead_letter, _set(["meta", "original_headers"], {"Nats-Msg-Id": b"x"})),
        (make_scored, _set([*_SCORES, "reward_components", 0], {b"format": 1.0})),
        (make_weight_version, _set(["meta", "version"], "3")),
        (make_weight_version, _set(["meta", "created_at_unix_s"], "1700000000")),
    ],
    ids=[
        "spaced-exponent-str-as-float",
        "str-as-float",
        "str-as-int",
        "float-as-int",
        "zero-float-as-int",
        "bool-as-int",
        "bool-as-float",
        "false-as-float",
        "int-as-bool",
        "zero-as-bool",
        "one-as-bool",
        "float-as-optional-int",
        "str-as-bytes",
        "str-as-image",
        "bin-as-text",
        "bin-as-identifier",
        "bin-map-key-in-json",
        "bin-as-json-value",
        "bin-map-key-in-headers",
        "bin-header-value",
        "bin-map-key-in-components",
        "str-as-version",
        "str-as-timestamp",
    ],
)
def test_no_coercion_on_the_wire(
    make: Callable[[], Message], change: Callable[[dict[str, Any]], None]
) -> None:
    assert refused(_mutated(make(), change)) is ReasonCode.WRONG_TYPE


def test_integers_are_floats_where_a_float_is_expected() -> None:
    # The one widening the page allows (and float32): an integer is exact as a float.
    payload = _mutated(make_weight_version(), _set(["meta", "created_at_unix_s"], 1_700_000_000))
    assert decode(None, payload).created_at_unix_s == 1_700_000_000.0


# ----------------------------------------------------------------------------- arrays


def _moved(path: list[str], by: int) -> Callable[[dict[str, Any]], None]:
    """The array at ``path`` copied ``by`` bytes past the end of the section, and pointed at."""

    def change(envelope: dict[str, Any]) -> None:
        descriptor = envelope["meta"]
        for key in path:
            descriptor = descriptor[key]
        offset, nbytes = descriptor["data"]
        data = envelope["data"]
        start = len(data) + (-len(data) % 8) + by
        envelope["data"] = data.ljust(start, b"\0") + data[offset : offset + nbytes]
        descriptor["data"] = [start, nbytes]

    return change


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (make_prompt_group, ["prompt_token_ids"]),
        (make_rollout, ["group", "prompt_token_ids"]),
        (make_rollout, ["samples", "response_token_ids"]),
        (make_rollout, ["samples", "behaviour_logprobs"]),
        (make_rollout, ["samples", "token_weight_versions"]),
        (make_rollout, ["samples", "loss_mask"]),
        (make_scored, ["scores", "teacher_logprobs"]),
    ],
    ids=["prompt", "group-prompt", "response", "logprobs", "versions", "mask", "teacher"],
)
@pytest.mark.parametrize("by", [1, 2, 4])
def test_an_array_offset_is_a_multiple_of_8(
    make: Callable[[], Message], path: list[str], by: int
) -> None:
    assert decode(None, _mutated(make(), _moved(path, 0)))  # aligned: fine
    assert refused(_mutated(make(), _moved(path, by))) is ReasonCode.BAD_ARRAY


@pytest.mark.parametrize("byte", [2, 0x80, 0xFF])
def test_a_bool_array_holds_only_bytes_0_and_1(byte: int) -> None:
    def poke(envelope: dict[str, Any]) -> None:
        mask = envelope["meta"]["samples"]["loss_mask"]
        assert mask["dtype"] == "bool"
        data = bytearray(envelope["data"])
        data[mask["data"][0] + 3] = byte
        envelope["data"] = bytes(data)

    assert refused(_mutated(make_rollout(), poke)) is ReasonCode.BAD_ARRAY


# ----------------------------------------------------------------------------- documented rules


@pytest.mark.parametrize(
    ("make", "change", "reason"),
    [
        (make_prompt_group, _set(["meta", "group_id"], "g1\n"), ReasonCode.INVALID_FIELD),
        (make_prompt_group, _set(["meta", "group_id"], "g" * 257), ReasonCode.INVALID_FIELD),
        (make_prompt_group, _set(["meta", "trace_id"], "t" * 129), ReasonCode.INVALID_FIELD),
        (make_prompt_group, _set(["meta", "environment"], ""), ReasonCode.INVALID_FIELD),
        (make_prompt_group, _set(["meta", "images"], [b"x"] * 65), ReasonCode.INVALID_FIELD),
        (
            make_prompt_group,
            _set(["meta", "prompt_messages"], [{"role": "", "content": "x"}]),
            ReasonCode.INVALID_FIELD,
        ),
        (make_prompt_group, _set(["meta", "dataset_position"], [1]), ReasonCode.WRONG_TYPE),
        (make_weight_version, _set(["meta", "version"], 2**63), ReasonCode.INVALID_FIELD),
        (
            make_weight_version,
            _set(["meta", "digest"], "sha256:" + "a" * 64 + "\n"),
            ReasonCode.INVALID_FIELD,
        ),
        (
            make_weight_version,
            _set(["meta", "created_at_unix_s"], float("inf")),
            ReasonCode.NON_FINITE,
        ),
        (
            make_weight_version,
            _set(["meta", "created_at_unix_s"], float("nan")),
            ReasonCode.NON_FINITE,
        ),
        (make_weight_version, _set(["meta", "created_at_unix_s"], -1.0), ReasonCode.INVALID_FIELD),
        (
            make_rollout,
            _set([*_SAMPLES, "timings", "started_at_unix_s", 0], float("inf")),
            ReasonCode.NON_FINITE,
        ),
        (make_scored, _set([*_SCORES, "flags", 0], ["timeout\n"]), ReasonCode.INVALID_FIELD),
        (make_dead_letter, _set(["meta", "reason"], "r" * 65), ReasonCode.INVALID_FIELD),
        # An enumeration is a str (a bin or a number: wrong_type) of its listed values (any
        # other str: invalid_field).
        (make_rollout, _set([*_SAMPLES, "finish_reason", 0], b"stop"), ReasonCode.WRONG_TYPE),
        (make_rollout, _set([*_SAMPLES, "finish_reason", 0], 0), ReasonCode.WRONG_TYPE),
        (make_rollout, _set([*_SAMPLES, "finish_reason", 0], "stopped"), ReasonCode.INVALID_FIELD),
        (
            make_rollout,
            _set([*_SAMPLES, "segments", 0], [{"role": b"tool", "start": 0, "end": 1}]),
            ReasonCode.WRONG_TYPE,
        ),
        (
            make_rollout,
            _set([*_SAMPLES, "segments", 0], [{"role": "system", "start": 0, "end": 1}]),
            ReasonCode.INVALID_FIELD,
        ),
        (make_dead_letter, _set(["meta", "original_payload"], None), ReasonCode.MISSING_FIELD),
    ],
    ids=[
        "identifier-newline",
        "identifier-too-long",
        "trace-id-too-long",
        "empty-environment",
        "too-many-images",
        "empty-chat-role",
        "nested-map-as-list",
        "int-past-int64",
        "digest-newline",
        "infinite-timestamp",
        "nan-timestamp",
        "negative-timestamp",
        "infinite-timing",
        "flag-newline",
        "dead-reason-too-long",
        "bin-as-finish-reason",
        "int-as-finish-reason",
        "unlisted-finish-reason",
        "bin-as-segment-role",
        "unlisted-segment-role",
        "dead-letter-without-original",
    ],
)
def test_documented_rules(
    make: Callable[[], Message],
    change: Callable[[dict[str, Any]], None],
    reason: ReasonCode,
) -> None:
    assert refused(_mutated(make(), change)) is reason


def test_a_field_this_minor_does_not_know_is_ignored() -> None:
    # The compatibility rule: a newer minor may add fields with defaults.
    payload = _mutated(make_weight_version(), _set(["meta", "added_in_1_9"], {"any": [1]}))
    assert decode(None, payload) == make_weight_version()


@pytest.mark.parametrize(
    "extra",
    [
        {"k": msgpack.ExtType(1, b"x")},
        {"k": msgpack.Timestamp(0)},  # msgspec would read ext -1 as a datetime
        {"k": [1, {"deep": b"bytes"}]},
    ],
    ids=["ext", "timestamp", "nested-bin"],
)
def test_extra_holds_json_values_only(extra: dict[str, Any]) -> None:
    # ``extra`` is typed "JSON value" (docs/wire-format.md): msgpack's ext and bin are not.
    assert refused(_mutated(make_prompt_group(), _set(["meta", "extra"], extra))) is (
        ReasonCode.WRONG_TYPE
    )


def test_an_ext_value_in_a_typed_field_is_a_wrong_type() -> None:
    change = _set(["meta", "prompt_text"], msgpack.ExtType(5, b"text"))
    assert refused(_mutated(make_prompt_group(), change)) is ReasonCode.WRONG_TYPE


@pytest.mark.parametrize(
    ("make", "path"),
    [(make_prompt_group, ["meta", "extra"]), (make_rollout, [*_GROUP, "extra"])],
    ids=["prompt-group", "rollout-group"],
)
@pytest.mark.parametrize(
    "extra",
    [
        {"k": float("nan")},
        {"k": float("inf")},
        {"k": [1, {"deep": float("-inf")}]},
    ],
    ids=["nan", "inf", "nested-minus-inf"],
)
def test_extra_holds_finite_numbers_only(
    make: Callable[[], Message], path: list[Any], extra: dict[str, Any]
) -> None:
    # ``extra`` holds JSON values (docs/wire-format.md); JSON has no NaN or infinity, so a
    # non-finite float there is refused like any other (non_finite), and `replay export` never
    # has to write a bare `NaN`.
    assert refused(_mutated(make(), _set(path, extra))) is ReasonCode.NON_FINITE


def test_a_prompt_group_built_in_python_refuses_a_non_finite_extra() -> None:
    with pytest.raises(WireError) as caught:
        make_prompt_group(extra={"score": float("nan")})
    assert caught.value.reason is ReasonCode.NON_FINITE
    assert "extra.score" in str(caught.value)


# ----------------------------------------------------------------------------- order of checks


def _refused_with(headers: dict[str, str], payload: bytes) -> ReasonCode:
    with pytest.raises(CodecError) as caught:
        decode(headers, payload)
    return caught.value.reason


def test_the_headers_are_compared_before_the_payloads_version_is_judged() -> None:
    # docs/wire-format.md, "Validation on decode": the payload's name and version are compared
    # with the headers (header_mismatch) before the version is judged (unsupported_version).
    headers = encode(make_weight_version()).headers
    payload = _mutated(make_weight_version(), _set(["schema_version"], "9.0"))
    assert _refused_with(headers, payload) is ReasonCode.HEADER_MISMATCH
    assert refused(payload) is ReasonCode.UNSUPPORTED_VERSION  # a bare payload


def test_the_headers_are_compared_before_the_payloads_name_is_looked_up() -> None:
    headers = encode(make_weight_version()).headers
    payload = _mutated(make_weight_version(), _set(["schema"], "weight_version_v9"))
    assert _refused_with(headers, payload) is ReasonCode.HEADER_MISMATCH
    assert refused(payload) is ReasonCode.UNKNOWN_SCHEMA  # a bare payload


_STARTED = [*_SAMPLES, "timings", "started_at_unix_s"]


@pytest.mark.parametrize(
    ("make", "path", "value"),
    [
        (make_weight_version, ["meta", "created_at_unix_s"], [float("-inf")]),
        (make_rollout, _STARTED, [float("-inf"), 1.0]),
    ],
    ids=["time", "time-column"],
)
def test_minus_infinity_for_a_time_is_non_finite_not_below_the_range(
    make: Callable[[], Message], path: list[Any], value: list[float]
) -> None:
    # A time is "float ≥ 0" and finite: its finiteness is judged with its bound, first.
    change = _set(path, value[0] if len(value) == 1 else value)
    assert refused(_mutated(make(), change)) is ReasonCode.NON_FINITE


@pytest.mark.parametrize(
    ("column", "reason"),
    [
        ([-1.0, float("-inf")], ReasonCode.INVALID_FIELD),
        ([float("nan"), -1.0], ReasonCode.NON_FINITE),
    ],
    ids=["negative-first", "nan-first"],
)
def test_the_first_refused_entry_of_a_column_decides(
    column: list[float], reason: ReasonCode
) -> None:
    assert refused(_mutated(make_rollout(), _set(_STARTED, column))) is reason


# ----------------------------------------------------------------------------- weight events

_PATCH = "dockyard-sparse-patch"


@pytest.mark.parametrize(
    ("fields", "accepted"),
    [
        ({"format": "safetensors", "delta_base_version": None}, True),
        ({"format": _PATCH, "delta_base_version": 2}, True),
        ({"format": "a-future-format", "delta_base_version": None}, True),
        ({"format": _PATCH, "delta_base_version": None}, False),
        ({"format": "safetensors", "delta_base_version": 2}, False),
        ({"format": "a-future-format", "delta_base_version": 2}, False),
    ],
    ids=[
        "snapshot",
        "patch",
        "other",
        "patch-without-base",
        "snapshot-with-base",
        "other-with-base",
    ],
)
def test_delta_base_version_is_set_exactly_when_the_format_is_a_patch(
    fields: dict[str, Any], accepted: bool
) -> None:
    # docs/wire-format.md, `weight_version`: delta_base_version is "set exactly when `format`
    # is `dockyard-sparse-patch`".
    def change(envelope: dict[str, Any]) -> None:
        envelope["meta"].update(fields)

    payload = _mutated(make_weight_version(), change)
    if accepted:
        event = decode(None, payload)
        assert (event.format, event.delta_base_version) == tuple(fields.values())  # type: ignore[attr-defined]
    else:
        assert refused(payload) is ReasonCode.INVALID_FIELD


def test_a_weight_event_built_in_python_pairs_the_patch_format_with_its_base() -> None:
    with pytest.raises(WireError) as caught:
        msgspec.structs.replace(make_weight_version(), format=_PATCH)
    assert caught.value.reason is ReasonCode.INVALID_FIELD
