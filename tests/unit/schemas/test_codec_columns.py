"""Column layout (schema 2.0): a list's arrays as one array per field plus a rows table.

Round trips (shared arrays, mixed layouts, 1.x frames) and a corpus of malformed columns, each
refused as ``bad_array`` (or ``array_too_large``) with the column's path, fast and small.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _columns(message: Any) -> dict[str, Any]:
    envelope = unpack_payload(encode(message).payload, columns=True)
    meta = envelope["meta"]
    return meta.get("rollout", meta)["@columns"]["samples"]


def test_an_array_shared_by_every_sample_is_written_once() -> None:
    prompt = np.arange(100, 164, dtype=np.int64)
    samples = [
        make_sample(i, 8, prompt_token_ids=prompt).model_copy(update={"prompt_token_ids": prompt})
        for i in range(4)
    ]
    rollout = Rollout(group=make_prompt_group(num_generations=4), samples=samples)
    column = _columns(rollout)["prompt_token_ids"]
    assert column["shape"] == [64]  # once, not 4 × 64: every row points at the same range
    decoded = decode(None, encode(rollout).payload)
    assert decoded == rollout
    assert all(s.prompt_token_ids.tolist() == prompt.tolist() for s in decoded.samples)


def test_fields_that_cannot_share_a_column_travel_per_item() -> None:
    scored = make_scored(num_samples=3)
    # Teacher log-probs for some samples only, and log-probs of two precisions.
    scores = [
        score.model_copy(update={"teacher_logprobs": None}) if score.sample_index == 1 else score
        for score in scored.scores
    ]
    samples = list(scored.rollout.samples)
    samples[2] = samples[2].model_copy(
        update={"behaviour_logprobs": samples[2].behaviour_logprobs.astype(np.float64)}
    )
    mixed = ScoredRollout(
        rollout=scored.rollout.model_copy(update={"samples": samples}),
        scores=scores,
        scorer_id=scored.scorer_id,
    )
    envelope = unpack_payload(encode(mixed).payload, columns=True)
    meta = envelope["meta"]
    assert "@columns" not in meta  # the scores' teacher log-probs: per item
    assert meta["scores"][1]["teacher_logprobs"] is None
    assert "behaviour_logprobs" not in meta["rollout"]["@columns"]["samples"]
    assert meta["rollout"]["samples"][2]["behaviour_logprobs"]["dtype"] == "float64"
    decoded = decode(None, encode(mixed).payload)
    assert decoded == mixed
    assert decoded.rollout.samples[2].behaviour_logprobs.dtype == np.float64


def test_teacher_log_probs_of_every_sample_travel_as_a_column() -> None:
    scored = make_scored(num_samples=3)
    envelope = unpack_payload(encode(scored).payload, columns=True)
    assert set(envelope["meta"]["@columns"]["scores"]) == {"teacher_logprobs"}
    assert decode(None, encode(scored).payload) == scored


def test_a_1x_frame_with_per_item_arrays_still_decodes() -> None:
    rollout = make_rollout(num_samples=3)
    envelope = unpack_payload(encode(rollout).payload)  # columns rewritten per item
    envelope["schema_version"] = "1.0"
    assert decode(None, repack(envelope)) == rollout


def test_an_unknown_major_version_names_the_readable_ones() -> None:
    envelope = unpack_payload(encode(make_rollout()).payload, columns=True)
    envelope["schema_version"] = "3.0"
    error = refusal(repack(envelope))
    assert error.reason is ReasonCode.UNSUPPORTED_VERSION
    assert "reads 1.x, 2.x" in error.detail


def test_a_bad_value_in_a_column_is_refused_with_the_samples_path() -> None:
    rollout = make_rollout(num_samples=3)
    envelope = unpack_payload(encode(rollout).payload, columns=True)
    column = envelope["meta"]["@columns"]["samples"]["behaviour_logprobs"]
    offset = column["data"][0]
    data = bytearray(envelope["data"])
    nan_at = 8 * 2 + 3  # sample 2, token 3 (every sample has 8 tokens)
    data[offset + 4 * nan_at : offset + 4 * nan_at + 4] = np.float32("nan").tobytes()
    envelope["data"] = bytes(data)
    error = refusal(repack(envelope))
    assert error.reason is ReasonCode.NON_FINITE
    assert "samples.2.behaviour_logprobs" in error.detail


def _column_change(change: Callable[[dict[str, Any], dict[str, Any]], None]) -> bytes:
    envelope = unpack_payload(encode(make_rollout(num_samples=3)).payload, columns=True)
    change(envelope, envelope["meta"]["@columns"]["samples"])
    return repack(envelope)


def _rows_bytes(envelope: dict[str, Any], column: dict[str, Any], rows: np.ndarray) -> None:
    """Overwrite a column's rows in the array section (same dtype and size)."""
    offset, nbytes = column["rows"]["data"]
    data = bytearray(envelope["data"])
    data[offset : offset + nbytes] = rows.astype(column["rows"]["dtype"]).tobytes()
    envelope["data"] = bytes(data)


MALFORMED_COLUMNS: dict[str, tuple[Callable[[dict[str, Any], dict[str, Any]], None], str]] = {
    "columns-not-a-map": (
        lambda env, cols: env["meta"].__setitem__("@columns", [1]),
        "must be a map",
    ),
    "unknown-list": (
        lambda env, cols: env["meta"]["@columns"].__setitem__("segments", {}),
        "names no list of models with array fields",
    ),
    "fields-not-a-map": (
        lambda env, cols: env["meta"]["@columns"].__setitem__("samples", [1]),
        "must be a map of field",
    ),
    "unknown-field": (
        lambda env, cols: cols.__setitem__("worker_id", cols["loss_mask"]),
        "is not an array field",
    ),
    "missing-rows": (
        lambda env, cols: cols["loss_mask"].pop("rows"),
        "keys dtype, shape, data, rows",
    ),
    "float-token-ids": (
        lambda env, cols: cols["response_token_ids"].__setitem__("dtype", "float16"),
        "is not allowed here",
    ),
    "float-rows": (
        lambda env, cols: cols["loss_mask"]["rows"].__setitem__("dtype", "float32"),
        "is not allowed here",
    ),
    "rows-for-too-few-items": (
        lambda env, cols: cols["loss_mask"]["rows"].__setitem__("shape", [2, 2]),
        "does not fit shape",
    ),
    "rows-of-wrong-width": (
        lambda env, cols: cols["loss_mask"]["rows"].update(shape=[3, 3], data=[0, 36]),
        "rows has shape [3, 3] for 3 items",
    ),
    "row-past-the-end": (
        lambda env, cols: _rows_bytes(env, cols["loss_mask"], np.array([[0, 8], [8, 8], [20, 8]])),
        "reaches past the column",
    ),
    "row-overflowing-uint32": (
        lambda env, cols: _rows_bytes(
            env, cols["loss_mask"], np.array([[0, 8], [8, 8], [2**32 - 1, 2]])
        ),
        "reaches past the column",
    ),
    "shape-disagrees-with-bytes": (
        lambda env, cols: cols["loss_mask"].__setitem__("shape", [25]),
        "does not fit shape",
    ),
    "range-outside-section": (
        lambda env, cols: cols["loss_mask"].__setitem__("data", [len(env["data"]), 24]),
        "does not fit shape",
    ),
    "unaligned-offset": (
        lambda env, cols: cols["loss_mask"]["data"].__setitem__(0, 3),
        "does not fit shape",
    ),
    "negative-dim": (
        lambda env, cols: cols["loss_mask"].__setitem__("shape", [-1]),
        "needs shape",
    ),
    "item-carries-the-field-too": (
        lambda env, cols: env["meta"]["samples"][1].__setitem__("loss_mask", [True] * 8),
        "carries the column's field itself",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED_COLUMNS))
def test_malformed_columns_are_refused(case: str) -> None:
    change, message = MALFORMED_COLUMNS[case]
    error = refusal(_column_change(change))
    assert error.reason is ReasonCode.BAD_ARRAY, error.detail
    assert message in error.detail and "@columns" in error.detail


def test_a_column_declaring_a_billion_elements_is_refused_before_allocating() -> None:
    def huge(env: dict[str, Any], cols: dict[str, Any]) -> None:
        cols["loss_mask"].update(shape=[10**9], data=[cols["loss_mask"]["data"][0], 10**9])

    error = refusal(_column_change(huge))
    assert error.reason is ReasonCode.ARRAY_TOO_LARGE


def test_columns_round_trip_scores_of_one_sample() -> None:
    scored = make_scored(num_samples=1)
    assert decode(None, encode(scored).payload) == scored
    assert isinstance(scored.scores[0], SampleScore)
