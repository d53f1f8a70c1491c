"""Round trips of every message type, zero-copy decoding, identity and versioning rules."""

from __future__ import annotations

import msgpack
import msgspec
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from schema_factories import (
    craft,
    dead_letters,
    make_dead_letter,
    make_prompt_group,
    make_rollout,
    make_sample,
    make_scored,
    make_weight_version,
    prompt_groups,
    rollouts,
    scored_rollouts,
    unpack_payload,
    weight_versions,
)

from dockyard.schemas import (
    CODEC_NAME,
    HEADER_CODEC,
    HEADER_MSG_ID,
    HEADER_SCHEMA,
    HEADER_SCHEMA_VERSION,
    MESSAGE_TYPES,
    DeadLetter,
    Message,
    PromptGroup,
    Rollout,
    ScoredRollout,
    WeightVersion,
    decode,
    encode,
)
from dockyard.schemas.rollout import RolloutSample

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def roundtrip(message: Message) -> Message:
    encoded = encode(message)
    with_headers = decode(encoded.headers, encoded.payload, expected=type(message))
    bare = decode(None, encoded.payload)  # replay tools have no headers
    assert with_headers == message
    assert bare == message
    return with_headers


@PROPERTY
@given(prompt_groups())
def test_prompt_group_round_trip(message: PromptGroup) -> None:
    roundtrip(message)


@PROPERTY
@given(rollouts())
def test_rollout_round_trip(message: Rollout) -> None:
    decoded = roundtrip(message)
    # One dtype per column: log-probs keep the widest precision any sample had; integers keep
    # their values (maybe in a narrower dtype).
    widest = np.result_type(*(sample.behaviour_logprobs for sample in message.samples))
    assert decoded.samples.behaviour_logprobs.dtype == widest
    for original, sample in zip(message.samples, decoded.samples, strict=True):
        assert np.array_equal(sample.behaviour_logprobs, original.behaviour_logprobs)
        assert np.array_equal(sample.response_token_ids, original.response_token_ids)


@PROPERTY
@given(scored_rollouts())
def test_scored_rollout_round_trip(message: ScoredRollout) -> None:
    roundtrip(message)


@PROPERTY
@given(weight_versions)
def test_weight_version_round_trip(message: WeightVersion) -> None:
    roundtrip(message)


@PROPERTY
@given(dead_letters)
def test_dead_letter_round_trip(message: DeadLetter) -> None:
    roundtrip(message)


def test_registry_names_every_message_type() -> None:
    assert set(MESSAGE_TYPES) == {
        "prompt_group",
        "rollout",
        "scored_rollout",
        "weight_version",
        "dead_letter",
    }
    versions = {name: cls.SCHEMA_VERSION for name, cls in MESSAGE_TYPES.items()}
    assert all(name == cls.SCHEMA_NAME for name, cls in MESSAGE_TYPES.items())
    # scored_rollout 1.1 added SampleScore.flags and .detail, prompt_group 1.1 added images
    # (all with defaults).
    assert versions == {
        "prompt_group": "1.1",
        "rollout": "3.2",
        "scored_rollout": "3.2",
        "weight_version": "1.0",
        "dead_letter": "1.0",
    }


def test_headers_carry_identity_schema_and_codec() -> None:
    encoded = encode(make_rollout())
    assert encoded.headers == {
        HEADER_MSG_ID: "rollout:run7-e0-i12:0",
        HEADER_SCHEMA: "rollout",
        HEADER_SCHEMA_VERSION: "3.2",
        HEADER_CODEC: CODEC_NAME,
    }


def test_payload_is_one_zstd_frame_of_one_msgpack_map_with_declared_size() -> None:
    payload = encode(make_scored()).payload
    params = zstandard.get_frame_parameters(payload)
    content = zstandard.ZstdDecompressor().decompress(payload)
    assert params.content_size == len(content)
    assert params.has_checksum
    envelope = msgpack.unpackb(content, raw=False, strict_map_key=True)  # any msgpack library
    assert list(envelope) == ["schema", "schema_version", "meta", "pad", "data"]
    assert envelope["schema"] == "scored_rollout"
    # The samples' log-probs: one array (every sample's values back to back), cut by the
    # samples' response lengths.
    columns = envelope["meta"]["rollout"]["samples"]
    samples = make_scored().rollout.samples
    assert columns["response_lengths"] == [8] * len(samples)
    descriptor = columns["behaviour_logprobs"]
    assert descriptor["dtype"] == "float32" and descriptor["shape"] == [8 * len(samples)]
    offset, nbytes = descriptor["data"]
    assert offset % 8 == 0 and nbytes == 32 * len(samples)
    values = np.frombuffer(envelope["data"][offset : offset + nbytes], "<f4")
    for index, sample in enumerate(samples):
        assert np.array_equal(values[8 * index : 8 * index + 8], sample.behaviour_logprobs)
    assert columns["worker_id"] == ["worker-a"] * len(samples)
    assert envelope["meta"]["scores"]["reward"] == [1.0, 0.0]


def test_decoded_arrays_are_read_only_views_of_the_decompressed_buffer() -> None:
    decoded = decode(None, encode(make_scored(num_samples=3, length=64)).payload)
    owners = set()
    arrays = [
        array
        for sample in decoded.rollout.samples
        for array in (
            sample.prompt_token_ids,
            sample.response_token_ids,
            sample.behaviour_logprobs,
            sample.token_weight_versions,
            sample.loss_mask,
        )
    ] + [score.teacher_logprobs for score in decoded.scores]
    for array in arrays:
        assert not array.flags.writeable
        assert not array.flags.owndata
        assert array.flags.aligned  # the array section starts 8-byte aligned
        base = array.base  # a slice of one whole-section view per dtype, or the section itself
        while isinstance(base, np.ndarray):
            assert not base.flags.owndata
            base = base.base
        assert isinstance(base, memoryview)
        owners.add(id(base.obj))
    assert len(owners) == 1  # all of them view the one decompressed buffer
    with pytest.raises(ValueError):
        decoded.rollout.samples[0].behaviour_logprobs[0] = 0.0


def test_token_ids_are_narrowed_on_the_wire_when_they_fit() -> None:
    small = make_sample(0, 4, response_token_ids=np.array([0, 5, 65_535, 7]))
    large = make_sample(1, 4, response_token_ids=np.array([0, 5, 65_536, 7], dtype=np.int64))
    group = make_prompt_group(num_generations=2)
    rollout = Rollout(group=group, samples=[small, large])
    columns = unpack_payload(encode(rollout).payload)["meta"]["samples"]
    # One dtype per column: the widest any sample needs.
    assert columns["response_token_ids"]["dtype"] == "uint32"
    assert columns["prompt_token_ids"]["dtype"] == "uint16"
    assert columns["token_weight_versions"]["dtype"] == "uint8"  # versions < 256
    alone = Rollout(group=make_prompt_group(num_generations=1), samples=[small])
    alone_columns = unpack_payload(encode(alone).payload)["meta"]["samples"]
    assert alone_columns["response_token_ids"]["dtype"] == "uint16"
    decoded = decode(None, encode(rollout).payload)
    assert decoded.samples[0].response_token_ids.tolist() == [0, 5, 65_535, 7]
    assert decoded.samples[1].response_token_ids.tolist() == [0, 5, 65_536, 7]


def test_big_endian_and_strided_arrays_are_written_little_endian() -> None:
    logprobs = np.array([-0.5, -1.25, -2.0, -0.125, -9.0, -3.5, -0.25, -1.0], dtype=">f8")
    sample = make_sample(0, 4, behaviour_logprobs=logprobs[::2])  # big-endian and strided
    rollout = Rollout(group=make_prompt_group(num_generations=1), samples=[sample])
    decoded = decode(None, encode(rollout).payload)
    assert decoded.samples[0].behaviour_logprobs.dtype == np.dtype("<f8")
    assert decoded.samples[0].behaviour_logprobs.tolist() == [-0.5, -2.0, -9.0, -0.25]


def test_generic_key_order_from_another_encoder_still_decodes() -> None:
    # A non-Python encoder may write "data" before "meta" and leave out "pad".
    envelope = unpack_payload(encode(make_rollout()).payload)
    reordered = {"data": envelope["data"], "meta": envelope["meta"], "schema": "rollout"}
    reordered["schema_version"] = "3.0"
    payload = zstandard.ZstdCompressor().compress(msgpack.packb(reordered, use_bin_type=True))
    assert decode(None, payload) == make_rollout()


def test_frame_without_declared_size_within_budget_decodes() -> None:
    content = zstandard.ZstdDecompressor().decompress(encode(make_rollout()).payload)
    streaming = zstandard.ZstdCompressor().compressobj()
    payload = streaming.compress(content) + streaming.flush()
    assert zstandard.get_frame_parameters(payload).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decode(None, payload) == make_rollout()


def test_message_ids_are_deterministic_from_content_identity() -> None:
    first = make_rollout()
    # The same group regenerated by another worker after a redelivery: same logical rollout.
    other_worker = Rollout(
        group=first.group,
        samples=[msgspec.structs.replace(s, **{"worker_id": "worker-b"}) for s in first.samples],
    )
    assert encode(first).message_id == encode(other_worker).message_id == "rollout:run7-e0-i12:0"
    redispatched = make_rollout(attempt=1)
    assert redispatched.message_id() == "rollout:run7-e0-i12:1"
    assert make_prompt_group().message_id() == "prompt_group:run7-e0-i12:0"
    assert make_scored().message_id() == "scored_rollout:run7-e0-i12:0"
    assert make_weight_version(9).message_id() == "weight_version:9"
    letter = make_dead_letter()
    assert letter.message_id() == "dead_letter:scorer:id=rollout:g:0"
    by_seq = msgspec.structs.replace(letter, **{"original_message_id": None})
    assert by_seq.message_id() == "dead_letter:scorer:seq=dockyard.rollouts#42"
    anonymous = msgspec.structs.replace(by_seq, **{"original_stream_seq": None})
    assert anonymous.message_id() == msgspec.structs.replace(anonymous).message_id()
    assert anonymous.message_id().startswith("dead_letter:scorer:sha256=")


def test_newer_minor_version_with_unknown_fields_decodes() -> None:
    envelope = unpack_payload(encode(make_weight_version()).payload)
    envelope["meta"]["added_in_1_3"] = {"anything": [1, 2, 3]}
    payload = craft(envelope["meta"], schema="weight_version", version="1.3")
    assert decode(None, payload) == make_weight_version()


def test_older_minor_version_missing_optional_fields_decodes_with_defaults() -> None:
    envelope = unpack_payload(encode(make_weight_version()).payload)
    del envelope["meta"]["delta_base_version"]
    del envelope["meta"]["format"]
    decoded = decode(None, craft(envelope["meta"], schema="weight_version", version="1.0"))
    assert decoded.format == "safetensors"
    assert decoded.delta_base_version is None


def test_uint8_loss_mask_and_empty_responses_round_trip() -> None:
    sample = make_sample(
        0,
        0,
        response_token_ids=np.array([], dtype=np.int64),
        behaviour_logprobs=np.array([], dtype=np.float32),
        token_weight_versions=np.array([], dtype=np.int64),
        loss_mask=np.array([], dtype=np.uint8),
        finish_reason="error",
    )
    rollout = Rollout(group=make_prompt_group(num_generations=1), samples=[sample])
    decoded = decode(None, encode(rollout).payload)
    assert decoded.samples[0].num_response_tokens == 0
    assert decoded.samples[0].loss_mask.dtype == np.uint8


def test_a_decoded_group_reads_as_its_row_structs() -> None:
    message = make_scored(num_samples=3, length=16)
    decoded = decode(None, encode(message).payload)
    assert type(decoded) is ScoredRollout and type(decoded.rollout.samples[0]) is RolloutSample
    assert decoded == message
    assert [row.sample_index for row in decoded.scores] == [0, 1, 2]


def test_groups_pickle_with_their_columns() -> None:
    # Messages cross process boundaries in Python too (multiprocessing, caches): the column
    # models derived from the row models must be importable by name.
    import pickle

    message = make_scored(num_samples=3)
    decoded = decode(None, encode(message).payload)
    for original in (message, decoded):
        copy = pickle.loads(pickle.dumps(original, protocol=5))
        # The rows a group was built from are a cache: they do not travel (twice the bytes).
        assert "rows" not in copy.rollout.samples.__dict__
        assert "rows" not in copy.scores.__dict__
        assert copy == message
        assert copy.rollout.samples[2].sampling == message.rollout.samples[2].sampling
