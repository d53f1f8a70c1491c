"""The compiled reader against the reference decode: same messages, and never more lenient.

``dockyard.schemas.compiled`` reads a message's packed metadata with msgspec into structs
derived from the pydantic models. Its contract: for any metadata, it either gives exactly the
message the reference path (msgpack + pydantic) gives, or says "not sure" (None) — it must never
accept what the reference refuses. These tests check that on valid messages of every type and
on thousands of mutations of them (type swaps, bounds, NaN, trailing newlines, missing and
extra keys, broken array descriptors).
"""

from __future__ import annotations

import copy
import math
import random
import re
from typing import Annotated, Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from schema_factories import (
    make_dead_letter,
    make_prompt_group,
    make_rollout,
    make_scored,
    make_weight_version,
    scored_rollouts,
)

from dockyard.schemas import CodecError, DecodeLimits, ReasonCode, ScoredRollout, decode, encode
from dockyard.schemas.base import IDENTIFIER_PATTERN
from dockyard.schemas.codec import _validate
from dockyard.schemas.compiled import _python_pattern, has_compiled_reader, read_compiled
from dockyard.schemas.envelope import parse_envelope, scan_envelope
from dockyard.schemas.frames import decompress_bounded
from dockyard.schemas.limits import DEFAULT_LIMITS
from dockyard.schemas.messages import MESSAGE_TYPES
from dockyard.schemas.rollout import Segment
from dockyard.schemas.scored import FLAG_PATTERN

MESSAGES = {
    "prompt_group": make_prompt_group,
    "rollout": lambda: make_rollout(num_samples=3),
    "scored_rollout": lambda: make_scored(num_samples=3, teacher=True),
    "scored_rollout_no_teacher": lambda: make_scored(num_samples=2, teacher=False),
    "weight_version": make_weight_version,
    "dead_letter": make_dead_letter,
}

_UNPACK_LIMITS = {
    "raw": False,
    "strict_map_key": True,
    "max_str_len": DEFAULT_LIMITS.max_str_bytes,
    "max_bin_len": DEFAULT_LIMITS.max_bin_bytes,
    "max_array_len": DEFAULT_LIMITS.max_container_len,
    "max_map_len": DEFAULT_LIMITS.max_container_len,
    "max_ext_len": 0,
}


def content_of(message: Any) -> bytes:
    return decompress_bounded(encode(message).payload, DEFAULT_LIMITS.max_decompressed_bytes)


def reference(cls: type, meta: bytes, blob: Any, limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """The reference decode of packed ``meta``: the message, or the CodecError it raises."""
    try:
        unpacked = msgpack.unpackb(meta, **_UNPACK_LIMITS)
    except Exception as exc:  # any unpack failure is a refusal in the codec
        return CodecError(ReasonCode.BAD_MSGPACK, str(exc))
    if not isinstance(unpacked, dict):
        return CodecError(ReasonCode.BAD_ENVELOPE, "meta is not a map")
    try:
        return _validate(cls, unpacked, blob, limits)
    except CodecError as exc:
        return exc


def assert_same(left: Any, right: Any, where: str = "message") -> None:
    """Equal values of equal types all the way down (``==`` alone takes 1 for 1.0 and True)."""
    assert type(left) is type(right), f"{where}: {type(left).__name__} vs {type(right).__name__}"
    if isinstance(left, BaseModel):
        assert left.__pydantic_fields_set__ == right.__pydantic_fields_set__, where
        assert left.__dict__.keys() == right.__dict__.keys(), where
        for name in type(left).model_fields:
            assert_same(left.__dict__[name], right.__dict__[name], f"{where}.{name}")
    elif isinstance(left, np.ndarray):
        assert left.dtype == right.dtype and left.shape == right.shape, where
        assert np.array_equal(left, right, equal_nan=left.dtype.kind == "f"), where
        assert left.flags.writeable == right.flags.writeable, where
    elif isinstance(left, list):
        assert len(left) == len(right), where
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(left, dict):
        assert list(left) == list(right), where
        for key in left:
            assert_same(left[key], right[key], f"{where}[{key!r}]")
    elif isinstance(left, float) and math.isnan(left):
        assert math.isnan(right), where
    else:
        assert left == right, where


# ----------------------------------------------------------------------------- coverage


def test_every_current_message_type_has_a_compiled_reader():
    # Otherwise decoding silently takes the slower reference path for that type.
    assert {name for name, cls in MESSAGE_TYPES.items() if not has_compiled_reader(cls)} == set()


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_valid_messages_read_the_same_both_ways(name):
    message = MESSAGES[name]()
    envelope = scan_envelope(content_of(message), DEFAULT_LIMITS)
    assert envelope is not None
    compiled = read_compiled(type(message), envelope.meta, envelope.data, DEFAULT_LIMITS)
    assert compiled is not None, "a valid message must not need the reference path"
    assert_same(compiled, reference(type(message), bytes(envelope.meta), envelope.data))
    assert compiled == message


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scored_rollouts())
def test_generated_scored_rollouts_read_the_same_both_ways(message):
    envelope = scan_envelope(content_of(message), DEFAULT_LIMITS)
    compiled = read_compiled(ScoredRollout, envelope.meta, envelope.data, DEFAULT_LIMITS)
    assert compiled is not None
    assert_same(compiled, reference(ScoredRollout, bytes(envelope.meta), envelope.data))


def test_decode_takes_the_compiled_path_for_valid_messages(monkeypatch):
    from dockyard.schemas import codec

    taken = []
    original = codec.read_compiled

    def spy(*args: Any) -> Any:
        result = original(*args)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(codec, "read_compiled", spy)
    for build in MESSAGES.values():
        message = build()
        assert decode(None, encode(message).payload) == message
    assert taken == [True] * len(MESSAGES)
    taken.clear()
    for build in MESSAGES.values():  # the reference path alone reads them the same
        message = build()
        assert decode(None, encode(message).payload, compiled=False) == message
    assert taken == []


# ----------------------------------------------------------------------------- mutations

#: Values a mutation may put anywhere: each is wrong (or right) for some field.
TRICKY = [
    None,
    True,
    False,
    0,
    1,
    -1,
    3,
    2**31,
    2**63 - 1,
    2**63,
    2**64 - 1,
    -(2**63),
    0.0,
    -0.0,
    1.0,
    0.5,
    2.5,
    -1.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    "",
    "x",
    "stop",
    "length",
    "tool",
    "assistant",
    "ok_flag",
    "Bad Flag",
    "flag\n",
    "group-1\n",
    "a" * 1001,
    "é" * 5,
    b"",
    b"bytes",
    [],
    [1],
    [None],
    ["x"],
    [[]],
    {},
    {"x": 1},
    {"dtype": "uint8", "shape": [0], "data": [0, 0]},
    {"dtype": "float32", "shape": [1], "data": [0, 4]},
    {"dtype": "uint8", "shape": [2, 1], "data": [0, 2]},
    {"dtype": "uint8", "shape": [1], "data": [0, 1], "extra": 1},
    {"dtype": ">u2", "shape": [1], "data": [0, 2]},
    {"dtype": "uint8", "shape": [1], "data": [10**9, 1]},
    {"role": "tool", "start": 0, "end": 0},
    {"role": "tool", "start": 2, "end": 1},
    # msgpack values the reference unpacker refuses or converts: ext types, timestamps, map
    # keys that are not strings
    msgpack.ExtType(1, b"x"),
    msgpack.Timestamp(0),
    {1: 2},
    {b"key": 1},
    {"nested": [msgpack.ExtType(2, b"")]},
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            paths += _paths(value, (*prefix, index))
    return paths


def _mutate(meta: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    mutated = copy.deepcopy(meta)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        path = rng.choice(_paths(mutated)[1:])
        parent = mutated
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        action = rng.random()
        if action < 0.12 and isinstance(parent, dict):
            del parent[key]
        elif action < 0.2 and isinstance(parent, dict):
            parent[rng.choice(["unknown_field", "@columns", "shape", "role"])] = rng.choice(TRICKY)
        elif action < 0.3 and isinstance(parent[key], list) and parent[key]:
            parent[key].append(copy.deepcopy(parent[key][0]))
        elif action < 0.38 and isinstance(parent[key], list) and parent[key]:
            parent[key].pop()
        else:
            parent[key] = copy.deepcopy(rng.choice(TRICKY))
    return mutated


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_mutated_metadata_is_never_accepted_by_the_compiled_reader_alone(name):
    message = MESSAGES[name]()
    cls = type(message)
    envelope = parse_envelope(content_of(message), DEFAULT_LIMITS)
    rng = random.Random(f"compiled-{name}")
    outcomes = {"both accept": 0, "both refuse": 0, "compiled unsure, reference accepts": 0}
    for _ in range(600):
        meta = msgpack.packb(_mutate(envelope.meta, rng), use_bin_type=True)
        compiled = read_compiled(cls, memoryview(meta), envelope.data, DEFAULT_LIMITS)
        expected = reference(cls, meta, envelope.data)
        if compiled is not None:
            assert not isinstance(expected, CodecError), (
                f"the compiled reader accepted what the reference refuses: {expected}"
            )
            assert_same(compiled, expected)
            outcomes["both accept"] += 1
        elif isinstance(expected, CodecError):
            outcomes["both refuse"] += 1
        else:
            outcomes["compiled unsure, reference accepts"] += 1
    # The mutations must exercise both sides of the contract, not only one.
    assert outcomes["both accept"] >= 20, outcomes
    assert outcomes["both refuse"] >= 100, outcomes


def test_a_group_id_with_a_trailing_newline_is_refused():
    # Python's ``$`` matches before a final newline, pydantic's regex does not: msgspec checks
    # the pattern with ``\Z`` instead, so an id that would end up in a header is refused either
    # way.
    message = make_prompt_group()
    envelope = parse_envelope(content_of(message), DEFAULT_LIMITS)
    meta = dict(envelope.meta, group_id="group-1\n")
    packed = msgpack.packb(meta, use_bin_type=True)
    assert read_compiled(type(message), memoryview(packed), envelope.data, DEFAULT_LIMITS) is None
    assert isinstance(reference(type(message), packed, envelope.data), CodecError)


@pytest.mark.parametrize(
    "extra",
    [{"k": msgpack.ExtType(1, b"x")}, {"k": msgpack.Timestamp(0)}, {1: "x"}, {"k": b"bytes"}],
)
def test_json_values_are_unpacked_the_reference_way(extra):
    # ``extra`` holds JSON values, which msgspec cannot express: the compiled reader unpacks
    # them with msgpack's reference settings (no ext types, str keys), so none of these slip in.
    message = make_prompt_group()
    envelope = parse_envelope(content_of(message), DEFAULT_LIMITS)
    packed = msgpack.packb(dict(envelope.meta, extra=extra), use_bin_type=True)
    assert read_compiled(type(message), memoryview(packed), envelope.data, DEFAULT_LIMITS) is None
    assert isinstance(reference(type(message), packed, envelope.data), CodecError)


def test_model_validators_run_on_compiled_reads():
    message = make_rollout(num_samples=2)
    envelope = parse_envelope(content_of(message), DEFAULT_LIMITS)
    meta = copy.deepcopy(envelope.meta)
    meta["samples"]["segments"][0] = [{"role": "assistant", "start": 3, "end": 1}]
    packed = msgpack.packb(meta, use_bin_type=True)
    assert read_compiled(type(message), memoryview(packed), envelope.data, DEFAULT_LIMITS) is None
    refused = reference(type(message), packed, envelope.data)
    assert isinstance(refused, CodecError) and "segment end < start" in str(refused)
    meta["samples"]["segments"][0] = [{"role": "assistant", "start": 1, "end": 3}]
    packed = msgpack.packb(meta, use_bin_type=True)
    read = read_compiled(type(message), memoryview(packed), envelope.data, DEFAULT_LIMITS)
    assert read is not None
    assert read.samples.segments[0] == [Segment(role="assistant", start=1, end=3)]


def test_metadata_larger_than_a_msgpack_limit_goes_the_reference_way():
    # The compiled reader cannot see msgpack's per-string and per-container limits; it leaves
    # any meta map longer than the smallest of them to the reference path, which enforces them.
    message = make_prompt_group()
    content = content_of(message)
    tight = DecodeLimits(max_container_len=64)
    assert scan_envelope(content, DEFAULT_LIMITS) is not None
    assert scan_envelope(content, tight) is None
    long_text = encode(make_prompt_group(prompt_text="x" * 100)).payload
    decode(None, long_text)
    with pytest.raises(CodecError, match="max_str_len"):
        decode(None, long_text, limits=DecodeLimits(max_str_bytes=99))


# ----------------------------------------------------------------------------- patterns


@pytest.mark.parametrize("pattern", [IDENTIFIER_PATTERN, FLAG_PATTERN])
@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(alphabet=st.sampled_from("abzAZ09_.:/@+=-\n\r\t \u00e9\u212a"), max_size=70),
        st.text(max_size=8),
        st.from_regex(r"[a-z][a-z0-9_]{0,63}\n?", fullmatch=True),
    )
)
def test_translated_patterns_accept_exactly_what_pydantic_accepts(pattern, text):
    translated = _python_pattern(pattern)
    assert translated is not None, "the message types' patterns are checked by msgspec"
    by_pydantic = True
    try:
        TypeAdapter(Annotated[str, Field(pattern=pattern)]).validate_python(text)
    except ValidationError:
        by_pydantic = False
    assert (re.search(translated, text) is not None) == by_pydantic


@pytest.mark.parametrize(
    "pattern",
    [
        r"^[a-z]+$",  # a quantifier other than {m} / {m,n}
        r"^[^a-z]{1,3}$",  # negation
        r"^[a-z\d]{1,3}$",  # an escape
        r"^[a-z--c]{1,3}$",  # Rust reads ``--`` as a set difference
        r"[a-z]{1,3}$",  # not anchored at the start
        r"^[a-z]{1,3}",  # not anchored at the end
        r"^(?i)[a-z]{1,3}$",  # a flag
    ],
)
def test_other_patterns_stay_with_pydantic(pattern):
    assert _python_pattern(pattern) is None


def test_a_score_flag_with_a_trailing_newline_is_refused():
    message = make_scored(num_samples=2, teacher=False)
    envelope = parse_envelope(content_of(message), DEFAULT_LIMITS)
    meta = copy.deepcopy(envelope.meta)
    meta["scores"]["flags"] = [["timeout\n"], []]
    packed = msgpack.packb(meta, use_bin_type=True)
    assert read_compiled(ScoredRollout, memoryview(packed), envelope.data, DEFAULT_LIMITS) is None
    assert isinstance(reference(ScoredRollout, packed, envelope.data), CodecError)


# ----------------------------------------------------------------------------- the envelope


def _envelope_entries(message: Any) -> dict[str, Any]:
    envelope = parse_envelope(content_of(message), DEFAULT_LIMITS)
    return {
        "schema": envelope.schema,
        "schema_version": envelope.version,
        "meta": envelope.meta,
        "pad": b"",
        "data": bytes(envelope.data),
    }


def _frame(content: bytes) -> bytes:
    from dockyard.schemas.frames import compress

    return compress(content)


def test_another_key_order_reads_the_same_both_ways():
    # Another encoder may order the envelope's entries otherwise (the array section is then
    # not aligned in the content: the views are unaligned, the values the same).
    message = make_scored(num_samples=2)
    entries = _envelope_entries(message)
    content = msgpack.packb(dict(reversed(list(entries.items()))), use_bin_type=True)
    envelope = scan_envelope(content, DEFAULT_LIMITS)
    assert envelope is not None
    compiled = read_compiled(ScoredRollout, envelope.meta, envelope.data, DEFAULT_LIMITS)
    assert compiled == message
    assert decode(None, _frame(content), compiled=False) == message


def test_a_repeated_envelope_key_is_refused():
    # Five distinct fields could hide a repeat in a map of six entries: the compiled path only
    # reads a map of exactly five, and the reference refuses the repeat.
    entries = _envelope_entries(make_prompt_group())
    body = b"".join(msgpack.packb(key) + msgpack.packb(value) for key, value in entries.items())
    content = b"\x86" + body + msgpack.packb("schema") + msgpack.packb("prompt_group")
    assert scan_envelope(content, DEFAULT_LIMITS) is None
    with pytest.raises(CodecError) as refused:
        decode(None, _frame(content))
    assert refused.value.reason is ReasonCode.BAD_ENVELOPE


def test_bytes_after_the_envelope_are_refused():
    content = content_of(make_prompt_group()) + b"\x00"
    assert scan_envelope(content, DEFAULT_LIMITS) is None
    with pytest.raises(CodecError) as refused:
        decode(None, _frame(content))
    assert refused.value.reason is ReasonCode.BAD_MSGPACK


def test_an_array_section_past_the_bin_limit_goes_the_reference_way():
    # The reference takes an array section that ends the content in place, past max_bin_bytes;
    # the compiled path leaves any such section to it.
    message = make_scored(num_samples=2, length=64)
    content = content_of(message)
    tight = DecodeLimits(max_bin_bytes=64)
    assert scan_envelope(content, DEFAULT_LIMITS) is not None
    assert scan_envelope(content, tight) is None
    assert decode(None, encode(message).payload, limits=tight) == message
