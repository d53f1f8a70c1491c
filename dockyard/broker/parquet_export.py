"""Scored experience as Parquet: one row per sample (``replay export --format parquet`` into one
file, ``dockyard archive`` into files partitioned by run and step; one writer serves both).

The columns are documented in docs/wire-format.md ("Parquet export"). The per-token arrays are
list columns built straight from the wire's back-to-back columns (offsets from the lengths), so
nothing is copied sample by sample; every value is the decoded message's, exactly: a group whose
arrays do not fit the archive's types without loss (a token id above int32, log-probs in
float64 that float32 would round) is refused with its reason, like a message that does not
decode or is not a scored rollout. Refused messages are never skipped silently: the caller
gets each one (its sequence, reason and stored bytes) to report.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dockyard.broker.inspect import Undecodable, decode_stored
from dockyard.broker.messages import StoredMessage
from dockyard.schemas import ScoredRollout

_INT32_MAX = np.iinfo(np.int32).max
_INT64_MAX = np.iinfo(np.int64).max

#: The archive's columns, in order (docs/wire-format.md, "Parquet export", says what each means).
SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("seq", pa.uint64(), nullable=False),
        pa.field("subject", pa.string(), nullable=False),
        pa.field("stored_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("environment", pa.string(), nullable=False),
        pa.field("agent", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("dataset_epoch", pa.int64(), nullable=False),
        pa.field("dataset_index", pa.int64(), nullable=False),
        pa.field("dispatch_weight_version", pa.int64(), nullable=False),
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("num_generations", pa.int64(), nullable=False),
        pa.field("sample_index", pa.int64(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behaviour_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("token_weight_versions", pa.list_(pa.int64()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.bool_()), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("worker_id", pa.string(), nullable=False),
        pa.field("engine", pa.string(), nullable=False),
        pa.field("engine_version", pa.string(), nullable=False),
        pa.field("generation_started_at_unix_s", pa.float64(), nullable=False),
        pa.field("generation_finished_at_unix_s", pa.float64(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("reward_components", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("invalid_action", pa.bool_(), nullable=False),
        pa.field("timed_out", pa.bool_(), nullable=False),
        pa.field("flags", pa.list_(pa.string()), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("teacher_logprobs", pa.list_(pa.float32()), nullable=True),
        pa.field("scorer_id", pa.string(), nullable=False),
        pa.field("scored_at_unix_s", pa.float64(), nullable=False),
    ]
)

#: Groups per Parquet row group: bounds the writer's memory, whatever the stream's size.
GROUPS_PER_ROW_GROUP = 256


class NotRepresentable(ValueError):
    """A group whose arrays the archive's column types would change."""


@dataclass(frozen=True)
class Refused:
    """A message that is not in the file, and why."""

    stored: StoredMessage
    reason: str
    detail: str


@dataclass
class ExportResult:
    groups: int = 0
    rows: int = 0
    refused: list[Refused] = field(default_factory=list)
    #: The sequence of the message the placement stopped at (None: the selection's end).
    stopped_at: int | None = None
    #: Rows written to each file.
    files: dict[Path, int] = field(default_factory=dict)


def _list_column(values: np.ndarray, lengths: list[int], kind: pa.DataType) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=kind))


def _token_ids(values: np.ndarray, what: str) -> np.ndarray:
    if values.size and int(values.max()) > _INT32_MAX:
        raise NotRepresentable(f"{what}: token id {int(values.max())} does not fit int32")
    return values.astype(np.int32, copy=False)


def _float32(values: np.ndarray, what: str) -> np.ndarray:
    narrowed = values.astype(np.float32, copy=False)
    # float16 and float32 widen exactly; float64 only when every value is a float32 one.
    if narrowed.dtype != values.dtype and not np.array_equal(narrowed.astype(values.dtype), values):
        raise NotRepresentable(f"{what}: {values.dtype} values that float32 would round")
    return narrowed


def _versions(values: np.ndarray) -> np.ndarray:
    if values.size and values.dtype == np.uint64 and int(values.max()) > _INT64_MAX:
        raise NotRepresentable(f"token_weight_versions: {int(values.max())} does not fit int64")
    return values.astype(np.int64, copy=False)


def group_batch(stored: StoredMessage, scored: ScoredRollout) -> pa.RecordBatch:
    """The G rows of one scored group (raises :class:`NotRepresentable`)."""
    group, samples, scores = scored.rollout.group, scored.rollout.samples, scored.scores
    count = len(scores)
    lengths = list(samples.response_lengths)
    prompts = (
        np.tile(samples.prompt_token_ids, count)
        if samples.prompt_shared
        else samples.prompt_token_ids
    )
    teachers = scores.teacher_runs()
    teacher_column = pa.array(
        [None if run is None else _float32(run, "teacher_logprobs") for run in teachers],
        type=pa.list_(pa.float32()),
    )

    def same(value: object) -> list[object]:
        return [value] * count

    columns: dict[str, object] = {
        "stream": same(stored.stream),
        "seq": same(stored.seq),
        "subject": same(stored.subject),
        "stored_at": same(stored.timestamp),
        "group_id": same(group.group_id),
        "attempt": same(group.attempt),
        "environment": same(group.environment),
        "agent": same(group.agent),
        "dataset": same(group.dataset_position.dataset),
        "dataset_epoch": same(group.dataset_position.epoch),
        "dataset_index": same(group.dataset_position.index),
        "dispatch_weight_version": same(group.dispatch_weight_version),
        "trace_id": same(group.trace_id),
        "num_generations": same(group.num_generations),
        "sample_index": list(range(count)),
        "prompt_token_ids": _list_column(
            _token_ids(prompts, "prompt_token_ids"), list(samples.prompt_lengths), pa.int32()
        ),
        "response_token_ids": _list_column(
            _token_ids(samples.response_token_ids, "response_token_ids"), lengths, pa.int32()
        ),
        "behaviour_logprobs": _list_column(
            _float32(samples.behaviour_logprobs, "behaviour_logprobs"), lengths, pa.float32()
        ),
        "token_weight_versions": _list_column(
            _versions(samples.token_weight_versions), lengths, pa.int64()
        ),
        "loss_mask": _list_column(samples.loss_mask.astype(np.bool_), lengths, pa.bool_()),
        "finish_reason": [str(reason.value) for reason in samples.finish_reason],
        "worker_id": list(samples.worker_id),
        "engine": list(samples.engine.name),
        "engine_version": list(samples.engine.version),
        "generation_started_at_unix_s": list(samples.timings.started_at_unix_s),
        "generation_finished_at_unix_s": list(samples.timings.finished_at_unix_s),
        "reward": list(scores.reward),
        "reward_components": [list(parts.items()) for parts in scores.reward_components],
        "invalid_action": list(scores.invalid_action),
        "timed_out": list(scores.timed_out),
        "flags": list(scores.flags),
        "detail": list(scores.detail),
        "teacher_logprobs": teacher_column,
        "scorer_id": same(scored.scorer_id),
        "scored_at_unix_s": same(scored.scored_at_unix_s),
    }
    arrays = [
        value if isinstance(value, pa.Array) else pa.array(value, type=column.type)
        for column, value in zip(SCHEMA, columns.values(), strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


@dataclass(frozen=True)
class _Rows:
    scored: ScoredRollout
    batch: pa.RecordBatch


def _batch_or_refusal(stored: StoredMessage) -> _Rows | Refused:
    message = decode_stored(stored)
    if isinstance(message, Undecodable):
        return Refused(stored, message.reason, message.detail)
    if not isinstance(message, ScoredRollout):
        return Refused(
            stored,
            "not_scored_rollout",
            f"a {type(message).SCHEMA_NAME} message: the Parquet export holds scored rollouts",
        )
    try:
        return _Rows(message, group_batch(stored, message))
    except NotRepresentable as error:
        return Refused(stored, "not_representable", str(error))


class _FileWriter:
    """One Parquet file, written as ``NAME.partial`` and renamed when complete: a reader never
    sees half a file, and an interrupted write leaves no file of the final name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = pq.ParquetWriter(self.partial, SCHEMA)
        self.pending: list[pa.RecordBatch] = []

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        if len(self.pending) >= GROUPS_PER_ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_batches(self.pending, SCHEMA))
            self.pending.clear()

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.partial.replace(self.path)

    def abandon(self) -> None:
        self.writer.close()
        self.partial.unlink(missing_ok=True)


#: Where a scored group's rows go: a file, or None to stop before its message (the caller will
#: place it on a later pass, e.g. once the trainer has settled its group).
Placement = Callable[[ScoredRollout], Path | None]


async def write_parquet(
    messages: AsyncIterator[StoredMessage], place: Placement, *, always: Path | None = None
) -> ExportResult:
    """Every scored group of ``messages`` into the file ``place`` names for it (one writer per
    file, bounded row groups), until ``place`` says stop (``stopped_at``: that message's
    sequence). The others are returned in ``refused``, in stream order. ``always``: a file
    written even when no group goes there (the schema, no rows)."""
    result = ExportResult()
    writers: dict[Path, _FileWriter] = {}
    if always is not None:
        writers[always] = _FileWriter(always)
    try:
        async for stored in messages:
            outcome = _batch_or_refusal(stored)
            if isinstance(outcome, Refused):
                result.refused.append(outcome)
                continue
            path = place(outcome.scored)
            if path is None:
                result.stopped_at = stored.seq
                break
            if path not in writers:
                writers[path] = _FileWriter(path)
            writers[path].add(outcome.batch)
            result.groups += 1
            result.rows += outcome.batch.num_rows
            result.files[path] = result.files.get(path, 0) + outcome.batch.num_rows
    except BaseException:
        for writer in writers.values():
            writer.abandon()
        raise
    for writer in writers.values():
        writer.close()
    return result


async def export_parquet(messages: AsyncIterator[StoredMessage], out: Path) -> ExportResult:
    """Write every scored group of ``messages`` to ``out`` (a file with the schema even when
    no group qualifies); the others are returned in ``refused``, in stream order."""
    return await write_parquet(messages, lambda _: out, always=out)
