"""Where training stands, shared by the trainer's rooms (:mod:`.loop`).

One object, passed to every room when the loop is built: the step, the version of the weights
the fleet was last given, the lineage of versions that ages groups, and the ledger. The rooms
that move training on (the step, the checkpoint's resume) write it; the others read it when
they act, so a resume that restores the ledger is seen by all of them at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dockyard.consumers.trainer.ledger import Ledger
from dockyard.consumers.trainer.lineage import VersionLineage

#: The ledger's append-only trail in the run directory.
LEDGER_FILE = "ledger.jsonl"


@dataclass
class TrainerSummary:
    steps: int
    weight_version: int
    val_accuracy_start: float | None = None
    val_accuracy_end: float | None = None
    dropped_stale: int = 0
    duplicates: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, val accuracy)


@dataclass
class Progress:
    ledger: Ledger
    step: int = 0
    #: The version of the weights last published (-1: none yet).
    weight_version: int = -1
    lineage: VersionLineage = field(default_factory=VersionLineage)
    summary: TrainerSummary = field(
        default_factory=lambda: TrainerSummary(steps=0, weight_version=-1)
    )
