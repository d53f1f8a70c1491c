"""scored_rollout 1.1+: SampleScore.flags and .detail (round trip, bounds, compatibility).

Since 3.0 the scores travel as columns (``meta["scores"]["flags"][i]``).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from schema_factories import craft, make_rollout, make_scored, unpack_payload

from dockyard.consumers.score_conversion import to_scored_rollout
from dockyard.environments.base import GroupScore, ScoreFlag
from dockyard.environments.base import SampleScore as EnvSampleScore
from dockyard.schemas import CodecError, ReasonCode, SampleScore, ScoredRollout, decode, encode
from dockyard.schemas.errors import WireError
from dockyard.schemas.scored import MAX_SCORE_DETAIL_CHARS, MAX_SCORE_FLAGS


def scored_with(flags: list[str], detail: str) -> ScoredRollout:
    base = make_scored(num_samples=2, length=8)
    scores = [
        msgspec.structs.replace(score, **{"flags": flags, "detail": detail})
        for score in base.scores
    ]
    return ScoredRollout(rollout=base.rollout, scores=scores, scorer_id="scorer-1")


def columns_meta(message: ScoredRollout) -> dict[str, Any]:
    """The envelope of ``message`` as written now (3.2: the scores as columns)."""
    envelope = unpack_payload(encode(message).payload)
    assert envelope["schema_version"] == "3.2"
    return envelope


def test_flags_and_detail_round_trip() -> None:
    message = scored_with(["integrity_violation", "test_timeout"], "2 of 5 tests passed; ✓ utf-8")
    decoded = decode(None, encode(message).payload, expected=ScoredRollout)
    assert decoded == message
    assert decoded.scores[1].flags == ["integrity_violation", "test_timeout"]
    assert decoded.scores[0].detail == "2 of 5 tests passed; ✓ utf-8"
    assert encode(message).headers["Dockyard-Schema-Version"] == "3.2"
    scores = columns_meta(message)["meta"]["scores"]
    assert scores["flags"] == [["integrity_violation", "test_timeout"]] * 2
    assert scores["detail"] == ["2 of 5 tests passed; ✓ utf-8"] * 2


def test_defaults_are_empty() -> None:
    score = SampleScore(sample_index=0, reward=1.0)
    assert (score.flags, score.detail) == ([], "")


def _payload(meta: dict[str, Any], version: str, data: bytes) -> bytes:
    return craft(meta, schema="scored_rollout", version=version, data=data)


def test_a_later_minor_with_unknown_score_fields_decodes() -> None:
    # What a 1.0 reader does with 1.1 fields, one minor further: unknown keys are ignored.
    message = scored_with(["timeout"], "ran past 30 s")
    envelope = columns_meta(message)
    meta = envelope["meta"]
    meta["scores"]["added_in_3_7"] = [{"x": [1, 2]}, {"x": [3]}]  # a new score column
    meta["rollout"]["samples"]["added_in_3_7"] = [0.5, 0.25]  # a new sample column
    meta["rollout"]["samples"]["sampling"]["added_in_3_7"] = ["a", "b"]  # nested columns
    meta["added_in_3_7"] = {"note": "a new top-level field"}
    decoded = decode(None, _payload(meta, "3.7", envelope["data"]))
    assert decoded == message
    assert decoded.scores[0].flags == ["timeout"] and decoded.scores[1].detail == "ran past 30 s"


@pytest.mark.parametrize(
    ("flags", "detail"),
    [
        (["Timeout"], ""),  # not snake_case
        (["has space"], ""),
        ([""], ""),
        (["x" * 65], ""),  # longer than 64
        ([f"flag_{i}" for i in range(MAX_SCORE_FLAGS + 1)], ""),  # too many
        ([], "d" * (MAX_SCORE_DETAIL_CHARS + 1)),  # detail too long
    ],
    ids=["upper", "space", "empty", "long-flag", "too-many", "long-detail"],
)
def test_out_of_bounds_flags_and_detail_are_refused(flags: list[str], detail: str) -> None:
    # msgspec checks Meta constraints where a message arrives (decode), not in ``__init__``.
    field = "detail" if detail else "flags"
    # 3.0: score 1's entry of the flags / detail column.
    envelope = columns_meta(make_scored())
    envelope["meta"]["scores"]["flags"][1] = flags
    envelope["meta"]["scores"]["detail"][1] = detail
    with pytest.raises(CodecError) as caught:
        decode(None, _payload(envelope["meta"], "3.0", envelope["data"]))
    assert caught.value.reason is ReasonCode.INVALID_FIELD
    assert f"scores.{field}.1" in caught.value.detail


def test_the_bounds_themselves_are_accepted() -> None:
    flags = [f"f{i}" for i in range(MAX_SCORE_FLAGS - 1)] + ["x" * 64]
    message = scored_with(flags, "é" * MAX_SCORE_DETAIL_CHARS)  # chars, not bytes
    assert decode(None, encode(message).payload) == message


def test_non_finite_rewards_are_refused_as_non_finite() -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(WireError):
            SampleScore(sample_index=0, reward=bad)
        with pytest.raises(WireError):
            SampleScore(sample_index=0, reward=0.0, reward_components={"x": bad})
        for field, value in (("reward_components", {"correct": bad}), ("reward", bad)):
            envelope = columns_meta(make_scored())
            envelope["meta"]["scores"][field][0] = value
            with pytest.raises(CodecError) as caught:
                decode(None, _payload(envelope["meta"], "3.0", envelope["data"]))
            assert caught.value.reason is ReasonCode.NON_FINITE
            assert f"scores.{field}.0" in caught.value.detail


def test_to_scored_rollout_carries_every_flag_and_the_detail() -> None:
    rollout = make_rollout(num_samples=3, length=4)
    teacher = np.full(4, -0.5, dtype=np.float32)
    group = GroupScore(
        group_id=rollout.group.group_id,
        samples=[
            EnvSampleScore(
                reward=0.0,
                flags=frozenset({ScoreFlag.TIMEOUT, ScoreFlag.SANDBOX_UNAVAILABLE}),
                detail="no sandbox answered",
            ),
            EnvSampleScore(
                reward=1.0,
                components={"tests": 1.0},
                flags=frozenset({ScoreFlag.INVALID_ACTION, ScoreFlag.PATCH_FAILED}),
                teacher_logprobs=teacher,
            ),
            EnvSampleScore(reward=0.5, detail="x" * (MAX_SCORE_DETAIL_CHARS + 50)),
        ],
    )
    scored = to_scored_rollout(rollout, group, scorer_id="scorer-9")
    first, second, third = scored.scores
    assert first.flags == ["sandbox_unavailable", "timeout"]
    assert (first.timed_out, first.invalid_action) == (True, False)
    assert first.detail == "no sandbox answered"
    assert second.flags == ["invalid_action", "patch_failed"]
    assert (second.timed_out, second.invalid_action) == (False, True)
    assert second.reward_components == {"tests": 1.0}
    assert third.flags == [] and len(third.detail) == MAX_SCORE_DETAIL_CHARS
    assert third.detail.endswith("…") and third.detail.startswith("x" * 100)
    decoded = decode(None, encode(scored).payload, expected=ScoredRollout)
    assert decoded == scored


def test_every_environment_flag_is_a_valid_wire_flag() -> None:
    assert len(ScoreFlag) <= MAX_SCORE_FLAGS
    SampleScore(sample_index=0, reward=0.0, flags=sorted(str(flag) for flag in ScoreFlag))


def test_prompt_group_images_round_trip_and_default_for_older_payloads():
    import numpy as np

    from dockyard.schemas import DatasetPosition, PromptGroup

    group = PromptGroup(
        group_id="g",
        prompt_token_ids=np.array([1, 2], dtype=np.int32),
        prompt_text="x",
        environment="math",
        agent="a",
        num_generations=1,
        dataset_position=DatasetPosition(dataset="d", epoch=0, index=0),
        dispatch_weight_version=0,
        trace_id="t",
        images=[b"\x89PNG fake", b"GIF89a fake"],
    )
    decoded = decode(None, encode(group).payload)
    assert decoded.images == [b"\x89PNG fake", b"GIF89a fake"]
    assert (
        decode(None, encode(msgspec.structs.replace(group, **{"images": []})).payload).images == []
    )
    too_many = encode(msgspec.structs.replace(group, images=[b"x"] * 65)).payload
    with pytest.raises(CodecError) as caught:
        decode(None, too_many)
    assert caught.value.reason is ReasonCode.INVALID_FIELD
