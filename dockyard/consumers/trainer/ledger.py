"""The trainer's ledger: which groups were dispatched, trained (at which step) or dropped.

It is the seen-set that makes training idempotent (a redelivered or replayed scored group that
is already in the ledger is skipped) and the audit trail the fault tests read: every dispatched
group must end up trained exactly once, explicitly dropped (stale, dead-lettered, ...), or
named as still open when the run ends.

The authoritative copy is saved inside each checkpoint; ``ledger.jsonl`` in the run directory is
an append-only trail. On resume the trail is rewritten to match the checkpoint, because the steps
after the checkpoint are undone and their groups will be trained again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict


class LedgerSnapshot(TypedDict):
    """The ledger as a checkpoint's ``trainer_state.json`` holds it."""

    trained: dict[str, int]
    dropped: dict[str, str]
    dispatched: list[str]


@dataclass
class Ledger:
    trained: dict[str, int] = field(default_factory=dict)  # group id -> step
    dropped: dict[str, str] = field(default_factory=dict)  # group id -> reason
    dispatched: list[str] = field(default_factory=list)
    trail: Path | None = None
    # Kept as groups come and go (the trainer asks on every pass of its loop): every id
    # dispatched, and those of them not trained or dropped yet.
    _known: set[str] = field(init=False, repr=False, compare=False)
    _open: set[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._known = set(self.dispatched)
        self._open = self._known - self.trained.keys() - self.dropped.keys()

    def seen(self, group_id: str) -> bool:
        return group_id in self.trained or group_id in self.dropped

    def record_dispatched(self, group_ids: list[str]) -> None:
        # A restarted dispatcher re-issues the same ids; they are one group, not two.
        new = list(dict.fromkeys(g for g in group_ids if g not in self._known))
        self.dispatched.extend(new)
        self._known.update(new)
        self._open.update(g for g in new if not self.seen(g))
        self._append([{"event": "dispatched", "group_id": g} for g in new])

    def record_trained(self, group_ids: list[str], step: int) -> None:
        for group_id in group_ids:
            self.trained[group_id] = step
            self._open.discard(group_id)
        self._append([{"event": "trained", "group_id": g, "step": step} for g in group_ids])

    def record_dropped(self, group_id: str, reason: str) -> None:
        self.dropped[group_id] = reason
        self._open.discard(group_id)
        self._append([{"event": "dropped", "group_id": group_id, "reason": reason}])

    def record_open_at_end(self, reason: str) -> list[str]:
        """Say in the trail which dispatched groups the run ends without (neither trained nor
        dropped), so that the trail accounts for every group it names. They stay open in the
        ledger: a resumed run (a higher ``max_num_steps``) still trains them when they come."""
        left = [group_id for group_id in self.dispatched if group_id in self._open]
        self._append([{"event": "open_at_end", "group_id": g, "reason": reason} for g in left])
        return left

    def open_groups(self) -> set[str]:
        """Dispatched groups not trained or dropped yet."""
        return set(self._open)

    @property
    def in_flight(self) -> int:
        """Dispatched groups not trained or dropped yet. Groups settled without having been
        dispatched by this ledger (replayed from an incarnation that left no checkpoint) do not
        count against it."""
        return len(self._open)

    def _append(self, events: list[dict[str, object]]) -> None:
        if self.trail is None or not events:
            return
        with self.trail.open("a") as handle:
            for event in events:
                handle.write(json.dumps(event) + "\n")

    def snapshot(self) -> LedgerSnapshot:
        return {
            "trained": dict(self.trained),
            "dropped": dict(self.dropped),
            "dispatched": list(self.dispatched),
        }

    @classmethod
    def restore(cls, snapshot: LedgerSnapshot, trail: Path | None) -> Ledger:
        ledger = cls(
            trained=dict(snapshot["trained"]),
            dropped=dict(snapshot["dropped"]),
            dispatched=list(snapshot["dispatched"]),
            trail=trail,
        )
        if trail is not None:
            ledger.rewrite_trail()
        return ledger

    def rewrite_trail(self) -> None:
        assert self.trail is not None
        events: list[dict[str, object]] = [
            {"event": "dispatched", "group_id": g} for g in self.dispatched
        ]
        events += [{"event": "trained", "group_id": g, "step": s} for g, s in self.trained.items()]
        events += [
            {"event": "dropped", "group_id": g, "reason": r} for g, r in self.dropped.items()
        ]
        self.trail.write_text("".join(json.dumps(e) + "\n" for e in events))


def read_trail(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
