"""Group layout (schema 3.0: a group's samples and scores field by field), as written and read.

Schema 3.0 carries a group's samples (and scores) field by field: lists of G values, and the
arrays of all samples back to back, cut by ``prompt_lengths`` / ``response_lengths`` (a prompt
shared by every sample travels once). Its refusals: column lists or arrays that disagree with
the group's size (``length_mismatch``), a list where the columns belong (``wrong_type``).
Pre-release layouts (1.x, 2.x) are not read: ``unsupported_version``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest
from schema_factories import (
    make_prompt_group,
    make_rollout,
    make_sample,
    make_scored,
    repack,
    unpack_payload,
)
from test_codec_refusals import refusal

from dockyard.schemas import ReasonCode, Rollout, ScoredRollout, decode, encode
from dockyard.schemas.scored import SampleScore


def v3_envelope(message: Rollout | ScoredRollout) -> dict[str, Any]:
    envelope = unpack_payload(encode(message).payload)
    assert envelope["schema_version"] == "3.2"
    return envelope


def _with_prompts(prompts: list[np.ndarray], length: int = 8) -> Rollout:
    samples = [make_sample(i, length, prompt_token_ids=prompt) for i, prompt in enumerate(prompts)]
    return Rollout(group=make_prompt_group(num_generations=len(prompts)), samples=samples)


# ----------------------------------------------------------------------------- 3.0 layout


def test_3_0_a_prompt_shared_by_every_sample_is_written_once() -> None:
    prompt = np.arange(100, 164, dtype=np.int64)
    # Equal prompts, not only the same object: each sample gets its own copy.
    rollout = _with_prompts([prompt.copy() for _ in range(4)])
    assert rollout.samples.prompt_shared
    samples = v3_envelope(rollout)["meta"]["samples"]
    assert samples["prompt_shared"] is True
    assert samples["prompt_lengths"] == [64] * 4
    assert samples["prompt_token_ids"]["shape"] == [64]  # once, not 4 × 64
    itemsize = np.dtype(samples["prompt_token_ids"]["dtype"]).itemsize
    assert samples["prompt_token_ids"]["data"][1] == 64 * itemsize  # one prompt's worth of ids
    decoded = decode(None, encode(rollout).payload)
    assert decoded == rollout
    assert decoded.samples.prompt_shared
    assert decoded.samples.prompt_token_ids.tolist() == prompt.tolist()
    assert all(s.prompt_token_ids.tolist() == prompt.tolist() for s in decoded.samples)
    assert [p.tolist() for p in decoded.samples.prompts()] == [prompt.tolist()] * 4


def test_3_0_samples_with_different_prompts_round_trip() -> None:
    prompts = [np.arange(5, dtype=np.int64), np.arange(3, dtype=np.int64) + 70_000,
               np.arange(5, dtype=np.int64), np.array([], dtype=np.int64)]  # fmt: skip
    rollout = _with_prompts(prompts)
    samples = v3_envelope(rollout)["meta"]["samples"]
    assert samples["prompt_shared"] is False
    assert samples["prompt_lengths"] == [5, 3, 5, 0]
    assert samples["prompt_token_ids"]["shape"] == [13]  # every prompt, back to back
    assert samples["prompt_token_ids"]["dtype"] == "uint32"  # 70_000 needs more than uint16
    decoded = decode(None, encode(rollout).payload)
    assert decoded == rollout
    assert not decoded.samples.prompt_shared
    for index, prompt in enumerate(prompts):
        assert decoded.samples[index].prompt_token_ids.tolist() == prompt.tolist()
        assert decoded.samples.prompts()[index].tolist() == prompt.tolist()


def test_3_0_teacher_log_probs_of_some_samples_only_round_trip() -> None:
    scored = make_scored(num_samples=3)
    scores = [
        msgspec.structs.replace(score, **{"teacher_logprobs": None})
        if score.sample_index == 1
        else score
        for score in scored.scores
    ]
    partial = ScoredRollout(rollout=scored.rollout, scores=scores, scorer_id=scored.scorer_id)
    columns = v3_envelope(partial)["meta"]["scores"]
    assert columns["teacher_lengths"] == [8, None, 8]
    assert columns["teacher_logprobs"]["shape"] == [16]  # only the samples that have them
    decoded = decode(None, encode(partial).payload, expected=ScoredRollout)
    assert decoded == partial
    assert decoded.scores.teacher_lengths == [8, None, 8]
    assert decoded.scores[1].teacher_logprobs is None
    for index in (0, 2):
        assert decoded.scores[index].teacher_logprobs.tolist() == [-0.25] * 8


def test_3_0_without_any_teacher_log_probs_round_trips() -> None:
    scored = make_scored(num_samples=3, teacher=False)
    columns = v3_envelope(scored)["meta"]["scores"]
    assert columns["teacher_lengths"] is None and columns["teacher_logprobs"] is None
    decoded = decode(None, encode(scored).payload)
    assert decoded == scored
    assert all(score.teacher_logprobs is None for score in decoded.scores)


def _v3_change(
    change: Callable[[dict[str, Any]], None], message: Rollout | ScoredRollout | None = None
) -> bytes:
    envelope = v3_envelope(message if message is not None else make_scored(num_samples=3))
    change(envelope["meta"])
    return repack(envelope)


def _shorten(descriptor: dict[str, Any], count: int) -> None:
    """A response array of ``count`` entries (the same bytes, cut short)."""
    itemsize = descriptor["data"][1] // descriptor["shape"][0]
    descriptor.update(shape=[count], data=[descriptor["data"][0], count * itemsize])


def _at(path: str, change: Callable[[Any], Any]) -> Callable[[dict[str, Any]], None]:
    """A change of the meta node at ``path`` (dot-separated keys)."""

    def apply(meta: dict[str, Any]) -> None:
        node: Any = meta
        for key in path.split("."):
            node = node[key]
        change(node)

    return apply


def _item(path: str, index: int, value: Any) -> Callable[[dict[str, Any]], None]:
    return _at(path, lambda column: column.__setitem__(index, value))


_SAMPLES = "rollout.samples"

#: Column lists with one entry too few or too many (3 samples), and what the refusal names.
COLUMN_COUNT_MISMATCHES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "worker-id-short": (
        _at(f"{_SAMPLES}.worker_id", list.pop),
        "samples.worker_id has 2 entries for 3 samples",
    ),
    "finish-reason-long": (
        _at(f"{_SAMPLES}.finish_reason", lambda c: c.append("stop")),
        "samples.finish_reason has 4 entries",
    ),
    "segments-short": (_at(f"{_SAMPLES}.segments", list.pop), "samples.segments has 2"),
    "tool-calls-long": (
        _at(f"{_SAMPLES}.tool_calls", lambda c: c.append([])),
        "samples.tool_calls has 4",
    ),
    "response-lengths-short": (
        _at(f"{_SAMPLES}.response_lengths", list.pop),
        "samples.response_lengths has 2",
    ),
    "prompt-lengths-short": (
        _at(f"{_SAMPLES}.prompt_lengths", list.pop),
        "entries for 2 samples",  # the count comes from prompt_lengths
    ),
    "nested-sampling-seed": (
        _at(f"{_SAMPLES}.sampling.seed", list.pop),
        "samples.sampling.seed has 2",
    ),
    "nested-timings-optional": (
        _at(f"{_SAMPLES}.timings.queue_wait_s", lambda c: c.append(None)),
        "samples.timings.queue_wait_s has 4",
    ),
    "scores-reward-short": (_at("scores.reward", list.pop), "entries for 2 samples"),
    "scores-flags-short": (_at("scores.flags", list.pop), "scores.flags has 2"),
    "scores-detail-long": (_at("scores.detail", lambda c: c.append("")), "scores.detail has 4"),
    "scores-teacher-lengths-short": (
        _at("scores.teacher_lengths", list.pop),
        "scores.teacher_lengths has 2",
    ),
}


_RESPONSE_ARRAYS = (
    "response_token_ids",
    "behaviour_logprobs",
    "token_weight_versions",
    "loss_mask",
)

#: Arrays that disagree with the lengths that cut them (3 samples of 8 response tokens, one
#: shared prompt of 4 tokens, teacher log-probs for every sample), and what the refusal names.
LENGTH_MISMATCHES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    # The lengths say 23 (or 25) tokens; every response array holds 24.
    "lengths-one-short": (
        _item(f"{_SAMPLES}.response_lengths", 2, 7),
        "response_token_ids has 24 entries for 23 response tokens",
    ),
    "lengths-one-long": (
        _item(f"{_SAMPLES}.response_lengths", 0, 9),
        "response_token_ids has 24 entries for 25 response tokens",
    ),
    # One response array shorter than the lengths say (the others agree with them).
    **{
        f"{name}-short": (
            _at(f"{_SAMPLES}.{name}", lambda d: _shorten(d, 23)),
            f"{name} has 23 entries for 24 response tokens",
        )
        for name in _RESPONSE_ARRAYS
    },
    "prompt-not-shared-but-one-prompt": (
        _at(_SAMPLES, lambda s: s.__setitem__("prompt_shared", False)),
        "prompt_token_ids has 4 entries for 12 tokens",
    ),
    "shared-prompt-of-another-length": (
        _item(f"{_SAMPLES}.prompt_lengths", 1, 3),
        "a shared prompt of 4 tokens, but prompt_lengths differ",
    ),
    "segment-past-its-response": (
        _item(f"{_SAMPLES}.segments", 1, [{"role": "assistant", "start": 0, "end": 9}]),
        "sample 1: segment [0, 9) exceeds 8 response tokens",
    ),
    "teacher-array-short": (
        _at("scores.teacher_logprobs", lambda d: _shorten(d, 16)),
        "teacher_logprobs has 16 entries for 24 teacher tokens",
    ),
    "teacher-lengths-disagree-with-array": (
        _item("scores.teacher_lengths", 0, 7),
        "teacher_logprobs has 24 entries for 23 teacher tokens",
    ),
    # The same total (7 + 8 + 9): only the samples' response lengths tell.
    "teacher-lengths-disagree-with-responses": (
        _at("scores.teacher_lengths", lambda c: c.__setitem__(slice(None), [7, 8, 9])),
        "sample 0: 7 teacher log-probs for 8 response tokens",
    ),
    "teacher-lengths-without-array": (
        _at("scores", lambda s: s.__setitem__("teacher_logprobs", None)),
        "teacher_lengths and teacher_logprobs come together",
    ),
    "teacher-array-without-lengths": (
        _at("scores", lambda s: s.__setitem__("teacher_lengths", None)),
        "teacher_lengths and teacher_logprobs come together",
    ),
}


@pytest.mark.parametrize("case", [*COLUMN_COUNT_MISMATCHES, *LENGTH_MISMATCHES])
def test_3_0_columns_or_arrays_of_the_wrong_length_are_refused(case: str) -> None:
    # Column lists with another number of entries than the group has samples, and arrays that
    # disagree with the lengths that cut them.
    change, message = {**COLUMN_COUNT_MISMATCHES, **LENGTH_MISMATCHES}[case]
    error = refusal(_v3_change(change))
    assert error.reason is ReasonCode.LENGTH_MISMATCH, error.detail
    assert message in error.detail


def test_3_0_samples_or_scores_given_as_a_list_are_refused_as_wrong_type() -> None:
    scored = make_scored(num_samples=2)
    # One map per sample (the pre-release layout's shape), where 3.0 wants columns.
    rows = [{"sample_index": 0, "worker_id": "w"}, {"sample_index": 1, "worker_id": "w"}]

    def samples_as_list(meta: dict[str, Any]) -> None:
        meta["rollout"]["samples"] = rows

    def scores_as_list(meta: dict[str, Any]) -> None:
        meta["scores"] = [{"sample_index": 0, "reward": 1.0}, {"sample_index": 1, "reward": 0.0}]

    for change, where in ((samples_as_list, "rollout.samples"), (scores_as_list, "scores")):
        envelope = v3_envelope(scored)
        change(envelope["meta"])
        error = refusal(repack(envelope))
        assert error.reason is ReasonCode.WRONG_TYPE, error.detail
        assert f"{where}: " in error.detail and "Expected `object`, got `array`" in error.detail
    error = refusal(_v3_change(lambda meta: meta.__setitem__("samples", []), make_rollout()))
    assert error.reason is ReasonCode.WRONG_TYPE, error.detail


def _nan_in_sample_2(envelope: dict[str, Any], column: dict[str, Any]) -> bytes:
    """``envelope`` with token 3 of sample 2 (8 tokens each) of the log-prob ``column`` NaN."""
    offset = column["data"][0]
    data = bytearray(envelope["data"])
    nan_at = 8 * 2 + 3
    data[offset + 4 * nan_at : offset + 4 * nan_at + 4] = np.float32("nan").tobytes()
    envelope["data"] = bytes(data)
    return repack(envelope)


def test_3_0_a_non_finite_log_prob_is_refused_with_the_column_path() -> None:
    envelope = v3_envelope(make_rollout(num_samples=3))
    error = refusal(_nan_in_sample_2(envelope, envelope["meta"]["samples"]["behaviour_logprobs"]))
    assert error.reason is ReasonCode.NON_FINITE
    assert "samples.behaviour_logprobs" in error.detail
    assert "first at entry 19" in error.detail


def test_an_unknown_major_version_names_the_readable_ones() -> None:
    envelope = v3_envelope(make_rollout())
    envelope["schema_version"] = "4.0"
    error = refusal(repack(envelope))
    assert error.reason is ReasonCode.UNSUPPORTED_VERSION
    assert "reads 3.x" in error.detail
    for version in ("2.0", "1.1", "0.9"):  # pre-release layouts are not read
        envelope = v3_envelope(make_scored())
        envelope["schema_version"] = version
        error = refusal(repack(envelope))
        assert error.reason is ReasonCode.UNSUPPORTED_VERSION
        assert "reads 3.x" in error.detail


def test_columns_round_trip_scores_of_one_sample() -> None:
    scored = make_scored(num_samples=1)
    assert decode(None, encode(scored).payload) == scored
    assert isinstance(scored.scores[0], SampleScore)
    assert isinstance(decode(None, encode(scored).payload).scores[0], SampleScore)


def test_3_0_an_absent_column_of_a_defaulted_field_reads_as_its_default() -> None:
    # An older minor's frame, written before a sampling field with a default existed, lacks
    # that column: the decoded columns carry the default for every sample, the same as the
    # group built from samples.
    rollout = make_rollout(num_samples=3)
    envelope = v3_envelope(rollout)
    del envelope["meta"]["samples"]["sampling"]["stop"]
    del envelope["meta"]["samples"]["timings"]["queue_wait_s"]
    decoded = decode(None, repack(envelope), expected=Rollout)
    assert decoded.samples.sampling.stop == [[], [], []]
    assert decoded.samples.timings.queue_wait_s == [None, None, None]
    assert decoded == rollout
    assert [sample.sampling.stop for sample in decoded.samples] == [[], [], []]


def test_3_0_a_required_column_of_a_nested_field_is_missing_field() -> None:
    envelope = v3_envelope(make_rollout(num_samples=3))
    del envelope["meta"]["samples"]["sampling"]["temperature"]
    assert refusal(repack(envelope)).reason is ReasonCode.MISSING_FIELD


def test_3_0_all_null_teacher_lengths_are_refused() -> None:
    # "teacher log-probs, for no sample" would read as present-but-empty downstream (the OPD
    # loss would train toward log p = 0): the column must be null instead.
    envelope = v3_envelope(make_scored(num_samples=3))
    columns = envelope["meta"]["scores"]
    columns["teacher_lengths"] = [None, None, None]
    columns["teacher_logprobs"].update(shape=[0], data=[columns["teacher_logprobs"]["data"][0], 0])
    error = refusal(repack(envelope))
    assert error.reason is ReasonCode.INVALID_FIELD, error.detail
    assert "teacher_lengths" in error.detail


def test_3_0_identical_prompts_written_apart_read_as_one_shared_prompt() -> None:
    # Another encoder may write G identical prompts back to back: the same content must read
    # (and compare) like the group built in Python, which shares the prompt.
    rollout = make_rollout(num_samples=3)
    envelope = v3_envelope(rollout)
    columns = envelope["meta"]["samples"]
    assert columns["prompt_shared"] is True
    prompt = columns["prompt_token_ids"]
    offset, nbytes = prompt["data"]
    data = bytearray(envelope["data"])
    tail = len(data)
    data += bytes(-tail % 8) + bytes(data[offset : offset + nbytes]) * 3
    envelope["data"] = bytes(data)
    start = tail + (-tail % 8)
    prompt.update(shape=[3 * prompt["shape"][0]], data=[start, 3 * nbytes])
    columns["prompt_shared"] = False
    decoded = decode(None, repack(envelope), expected=Rollout)
    assert decoded.samples.prompt_shared
    assert decoded == rollout


def test_a_copy_with_changed_columns_does_not_keep_the_old_rows() -> None:
    samples = make_rollout(num_samples=2).samples
    assert samples[0].worker_id == "worker-a"  # the rows are built (cached)
    copy = msgspec.structs.replace(samples, **{"worker_id": ["w1", "w2"]})
    assert [sample.worker_id for sample in copy] == ["w1", "w2"]
