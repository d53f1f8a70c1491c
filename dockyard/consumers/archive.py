"""Scored experience archived to Parquet, partitioned by run and step (``dockyard archive``).

The step a group trained at is not in its message: a scored group is stored before the trainer
takes it, and the trainer's ledger (``RUN/ledger.jsonl``) is what says which step used it. So
the archive reads the scored stream behind the trainer: it writes every group whose fate the
ledger knows, in stream order, and stops at the first one the trainer has not settled yet; the
next pass starts there. Partitions (Hive style, read as columns by pandas, DuckDB, polars):

    OUT/run=<run name>/step=<N>/part-<first seq>.parquet    a group trained at step N
    OUT/run=<run name>/step=-1/part-<first seq>.parquet     a group not trained: dropped
                                                            (stale, dead-lettered, ...), left
                                                            open when the run ended, or unknown
                                                            to this run's ledger

A pass writes its files under the name of the sequence it started from, then records the next
sequence in ``OUT/run=<run>/_archive_state.json``: a pass interrupted before that record is
repeated from the same sequence and rewrites the same files, so no row is archived twice.
The rows are the ``replay export --format parquet`` rows (the same writer); stored messages
that cannot be archived are returned to be reported, never skipped silently.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from dockyard.broker.messages import StoredMessage
from dockyard.broker.parquet_export import ExportResult, write_parquet
from dockyard.broker.plane import DataPlane
from dockyard.consumers.trainer.ledger import read_trail
from dockyard.consumers.trainer.loop import LEDGER_FILE
from dockyard.schemas import ScoredRollout

STATE_FILE = "_archive_state.json"
#: The step partition of a group that was not trained.
NOT_TRAINED = -1


@dataclass(frozen=True)
class LedgerFates:
    """What the trainer's ledger says of each group, read from its trail."""

    trained: dict[str, int]
    #: Dispatched and neither trained nor dropped yet (and not named open at the run's end).
    unsettled: frozenset[str]

    @classmethod
    def read(cls, run_dir: Path) -> LedgerFates:
        path = run_dir / LEDGER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no ledger trail (is {run_dir} a run directory?)")
        trained: dict[str, int] = {}
        settled: set[str] = set()
        dispatched: set[str] = set()
        for event in read_trail(path):
            group = str(event["group_id"])
            kind = event["event"]
            if kind == "dispatched":
                dispatched.add(group)
            elif kind == "trained":
                trained[group] = int(event["step"])  # type: ignore[call-overload]  # a ledger event's JSON value
                settled.add(group)
            else:  # dropped, open_at_end: the run will not train it
                settled.add(group)
        return cls(trained, frozenset(dispatched - settled))

    def step_of(self, group_id: str) -> int | None:
        """The group's step partition, or None while the trainer may still train it."""
        if group_id in self.trained:
            return self.trained[group_id]
        return None if group_id in self.unsettled else NOT_TRAINED


@dataclass(frozen=True)
class ArchivePass:
    from_seq: int
    next_seq: int
    result: ExportResult


def partition_dir(out: Path, run: str, step: int) -> Path:
    return out / f"run={run}" / f"step={step}"


def read_next_seq(out: Path, run: str) -> int:
    path = out / f"run={run}" / STATE_FILE
    return int(json.loads(path.read_text())["next_seq"]) if path.is_file() else 1


async def archive_pass(plane: DataPlane, run_dir: Path, out: Path, run: str) -> ArchivePass:
    """Archive the scored groups stored since the last pass whose fate the ledger knows."""
    fates = LedgerFates.read(run_dir)
    from_seq = read_next_seq(out, run)
    name = f"part-{from_seq:012d}.parquet"

    def place(scored: ScoredRollout) -> Path | None:
        step = fates.step_of(scored.group_id)
        return None if step is None else partition_dir(out, run, step) / name

    last_seen = from_seq - 1

    async def messages() -> AsyncIterator[StoredMessage]:
        nonlocal last_seen
        async for stored in plane.replay(plane.names.scored, from_seq=from_seq):
            yield stored
            last_seen = stored.seq

    result = await write_parquet(messages(), place)
    next_seq = result.stopped_at if result.stopped_at is not None else last_seen + 1
    state = out / f"run={run}" / STATE_FILE
    state.parent.mkdir(parents=True, exist_ok=True)
    partial = state.with_name(STATE_FILE + ".partial")
    partial.write_text(json.dumps({"next_seq": next_seq}))
    partial.replace(state)
    return ArchivePass(from_seq, next_seq, result)
