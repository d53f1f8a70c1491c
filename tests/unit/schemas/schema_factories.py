"""Valid messages for the schema tests: plain builders and hypothesis strategies."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import zstandard
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dockyard.schemas import (
    ChatMessage,
    DatasetPosition,
    DeadLetter,
    EngineInfo,
    PromptGroup,
    Rollout,
    RolloutSample,
    SampleScore,
    SampleTimings,
    SamplingParams,
    ScoredRollout,
    Segment,
    ToolCall,
    ToolCallError,
    WeightVersion,
)
from dockyard.schemas.rollout import PNG_SIGNATURE


def make_prompt_group(num_generations: int = 2, **overrides: Any) -> PromptGroup:
    fields: dict[str, Any] = {
        "group_id": "run7-e0-i12",
        "prompt_token_ids": np.array([101, 2023, 318, 257], dtype=np.int64),
        "prompt_text": "What is 2 + 3?",
        "prompt_messages": [ChatMessage(role="user", content="What is 2 + 3?")],
        "environment": "math",
        "agent": "single_turn",
        "num_generations": num_generations,
        "dataset_position": DatasetPosition(dataset="gsm8k", epoch=0, index=12),
        "ground_truth": "5",
        "extra": {"difficulty": 2, "tags": ["arith"]},
        "dispatch_weight_version": 7,
        "trace_id": "trace-abc",
        "created_at_unix_s": 1_700_000_000.5,
    }
    fields.update(overrides)
    return PromptGroup(**fields)


def make_sample(index: int = 0, length: int = 8, **overrides: Any) -> RolloutSample:
    rng = np.random.default_rng(index)
    fields: dict[str, Any] = {
        "sample_index": index,
        "prompt_token_ids": np.array([101, 2023, 318, 257], dtype=np.int64),
        "response_token_ids": rng.integers(0, 32_000, length, dtype=np.int64),
        "behaviour_logprobs": -rng.exponential(0.5, length).astype(np.float32),
        "token_weight_versions": np.full(length, 7, dtype=np.int64),
        "loss_mask": np.ones(length, dtype=np.bool_),
        "finish_reason": "stop",
        "sampling": SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=64, seed=index),
        "engine": EngineInfo(name="torch", version="2.13.0"),
        "worker_id": "worker-a",
        "timings": SampleTimings(started_at_unix_s=1.7e9, finished_at_unix_s=1.7e9 + 2.0),
    }
    fields.update(overrides)
    return RolloutSample(**fields)


def make_rollout(num_samples: int = 2, length: int = 8, **group_overrides: Any) -> Rollout:
    group = make_prompt_group(num_generations=num_samples, **group_overrides)
    samples = [make_sample(i, length) for i in range(num_samples)]
    return Rollout(group=group, samples=samples, created_at_unix_s=1.7e9)


def make_scored(num_samples: int = 2, length: int = 8, teacher: bool = True) -> ScoredRollout:
    rollout = make_rollout(num_samples, length)
    scores = [
        SampleScore(
            sample_index=i,
            reward=1.0 if i % 2 == 0 else 0.0,
            reward_components={"correct": 1.0},
            teacher_logprobs=np.full(length, -0.25, dtype=np.float32) if teacher else None,
        )
        for i in range(num_samples)
    ]
    return ScoredRollout(rollout=rollout, scores=scores, scorer_id="scorer-1")


def make_weight_version(version: int = 3) -> WeightVersion:
    return WeightVersion(
        version=version,
        step=version * 10,
        blob_ref=f"jetstream://weights/v{version}",
        digest="sha256:" + "ab" * 32,
        nbytes=123_456,
        created_at_unix_s=1.7e9,
        producer_id="trainer-0",
    )


def make_dead_letter() -> DeadLetter:
    return DeadLetter(
        original_subject="dockyard.rollouts",
        original_headers={"Nats-Msg-Id": "rollout:g:0"},
        original_payload=b"\x28\xb5\x2f\xfd garbage",
        original_message_id="rollout:g:0",
        original_stream_seq=42,
        stage="scorer",
        reason="corrupt_frame",
        message="zstd: not a frame",
        delivery_count=1,
        created_at_unix_s=1.7e9,
    )


# ----------------------------------------------------------------------------- crafting


def craft(
    meta: Any, *, schema: Any = "rollout", version: Any = "1.0", data: bytes = b"", **extra: Any
) -> bytes:
    """A payload built with plain msgpack (generic key order, ``data`` not in place)."""
    envelope = {"schema": schema, "schema_version": version, "meta": meta, "data": data, **extra}
    return zstandard.ZstdCompressor().compress(msgpack.packb(envelope, use_bin_type=True))


def unpack_payload(payload: bytes) -> dict[str, Any]:
    """The envelope of an encoded payload as plain Python data (``data`` as bytes)."""
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(payload), raw=False)


def repack(envelope: dict[str, Any]) -> bytes:
    return zstandard.ZstdCompressor().compress(msgpack.packb(envelope, use_bin_type=True))


# ----------------------------------------------------------------------------- hypothesis

identifiers = st.from_regex(r"[A-Za-z0-9_.:-]{1,24}", fullmatch=True)
short_text = st.text(max_size=40)
finite_floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
times = st.floats(min_value=0.0, max_value=4e9, allow_nan=False)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), short_text)
flags = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)
token_dtypes = st.sampled_from([np.int32, np.int64, np.uint16, np.uint32])


def token_arrays(size: int) -> st.SearchStrategy[np.ndarray]:
    return token_dtypes.flatmap(
        lambda dtype: hnp.arrays(
            dtype, size, elements=st.integers(0, min(np.iinfo(dtype).max, 200_000))
        )
    )


@st.composite
def prompt_groups(draw: st.DrawFn, num_generations: int | None = None) -> PromptGroup:
    return PromptGroup(
        group_id=draw(identifiers),
        attempt=draw(st.integers(0, 5)),
        prompt_token_ids=draw(token_arrays(draw(st.integers(0, 24)))),
        prompt_text=draw(short_text),
        prompt_messages=draw(
            st.lists(st.builds(ChatMessage, role=identifiers, content=short_text), max_size=3)
        ),
        environment=draw(identifiers),
        agent=draw(identifiers),
        num_generations=num_generations or draw(st.integers(1, 4)),
        dataset_position=DatasetPosition(
            dataset=draw(identifiers),
            epoch=draw(st.integers(0, 99)),
            index=draw(st.integers(0, 2**63 - 1)),
        ),
        ground_truth=draw(st.none() | short_text),
        extra=draw(st.dictionaries(identifiers, json_scalars, max_size=3)),
        dispatch_weight_version=draw(st.integers(0, 2**40)),
        trace_id=draw(identifiers),
        created_at_unix_s=draw(times),
    )


@st.composite
def rollout_samples(draw: st.DrawFn, index: int) -> RolloutSample:
    length = draw(st.integers(0, 40))
    logprob_dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    segments = []
    if length >= 2 and draw(st.booleans()):
        cut = draw(st.integers(0, length))
        segments = [
            Segment(role="assistant", start=0, end=cut),
            Segment(role="tool", start=cut, end=length),
        ]
    return RolloutSample(
        sample_index=index,
        prompt_token_ids=draw(token_arrays(draw(st.integers(0, 16)))),
        response_token_ids=draw(token_arrays(length)),
        behaviour_logprobs=draw(
            hnp.arrays(logprob_dtype, length, elements=st.floats(-60.0, 0.0, width=16))
        ),
        token_weight_versions=draw(hnp.arrays(np.int64, length, elements=st.integers(0, 2**33))),
        loss_mask=draw(
            hnp.arrays(
                draw(st.sampled_from([np.bool_, np.uint8])), length, elements=st.integers(0, 1)
            )
        ),
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_call", "abort", "error"])),
        sampling=SamplingParams(
            temperature=draw(st.floats(0.0, 2.0)),
            top_p=draw(st.floats(0.01, 1.0)),
            top_k=draw(st.integers(-1, 100)),
            max_new_tokens=draw(st.integers(1, 4096)),
            seed=draw(st.none() | st.integers(0, 2**63 - 1)),
            stop=draw(st.lists(short_text, max_size=2)),
        ),
        engine=EngineInfo(name=draw(identifiers), version=draw(identifiers)),
        worker_id=draw(identifiers),
        timings=SampleTimings(
            started_at_unix_s=draw(times),
            finished_at_unix_s=draw(times),
            time_to_first_token_s=draw(st.none() | st.floats(0.0, 100.0)),
        ),
        segments=segments,
        tool_calls=draw(
            st.lists(
                st.builds(
                    ToolCall,
                    call_id=identifiers,
                    name=identifiers,
                    arguments_json=st.just('{"x": 1}'),
                    result=st.none() | short_text,
                    error=st.none() | st.sampled_from([e.value for e in ToolCallError]),
                ),
                max_size=2,
            )
        ),
        # PNG signature + arbitrary bytes: the wire checks the signature, not the pixels.
        images=draw(
            st.lists(st.binary(max_size=24).map(lambda tail: PNG_SIGNATURE + tail), max_size=2)
        ),
    )


@st.composite
def rollouts(draw: st.DrawFn) -> Rollout:
    group = draw(prompt_groups())
    samples = [draw(rollout_samples(i)) for i in range(group.num_generations)]
    return Rollout(group=group, samples=samples, created_at_unix_s=draw(times))


@st.composite
def scored_rollouts(draw: st.DrawFn) -> ScoredRollout:
    rollout = draw(rollouts())
    scores = []
    for sample in rollout.samples:
        length = sample.num_response_tokens
        teacher = draw(
            st.none() | hnp.arrays(np.float32, length, elements=st.floats(-30.0, 0.0, width=32))
        )
        scores.append(
            SampleScore(
                sample_index=sample.sample_index,
                reward=draw(finite_floats),
                reward_components=draw(st.dictionaries(identifiers, finite_floats, max_size=3)),
                invalid_action=draw(st.booleans()),
                timed_out=draw(st.booleans()),
                teacher_logprobs=teacher,
                flags=draw(st.lists(flags, max_size=4, unique=True)),
                detail=draw(st.text(max_size=60)),
            )
        )
    return ScoredRollout(
        rollout=rollout, scores=scores, scorer_id=draw(identifiers), scored_at_unix_s=draw(times)
    )


#: (format, delta_base_version): a base exactly for a patch (docs/wire-format.md).
_formats = st.tuples(
    identifiers.filter(lambda name: name != "dockyard-sparse-patch"), st.none()
) | st.tuples(st.just("dockyard-sparse-patch"), st.integers(0, 2**40))

weight_versions = _formats.flatmap(
    lambda pair: st.builds(
        WeightVersion,
        version=st.integers(0, 2**40),
        step=st.integers(0, 2**40),
        blob_ref=st.text(min_size=1, max_size=60),
        digest=st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex()),
        nbytes=st.integers(0, 2**50),
        format=st.just(pair[0]),
        dtype=identifiers,
        delta_base_version=st.just(pair[1]),
        created_at_unix_s=times,
        producer_id=identifiers,
    )
)

dead_letters = st.builds(
    DeadLetter,
    original_subject=identifiers,
    original_headers=st.dictionaries(identifiers, short_text, max_size=4),
    original_payload=st.binary(max_size=200),
    original_ref=st.none() | identifiers,
    original_message_id=st.none() | identifiers,
    original_stream_seq=st.none() | st.integers(0, 2**63 - 1),
    stage=identifiers,
    reason=identifiers,
    message=short_text,
    delivery_count=st.integers(0, 100),
    created_at_unix_s=times,
)
