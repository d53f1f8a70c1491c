"""The live view of a run: per-role health and the trainer's latest numbers."""

from __future__ import annotations

import time
from pathlib import Path

from rich.table import Table

from dockyard.utils.status import RoleStatus, read_statuses

STALE_AFTER_S = 30.0


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or value < 0:
        return "–"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def trainer_status(statuses: list[RoleStatus]) -> RoleStatus | None:
    return next((s for s in statuses if s.role == "trainer"), None)


def render(status_dir: Path, started_at: float, max_steps: int) -> Table:
    statuses = read_statuses(status_dir) if status_dir.exists() else []
    trainer = trainer_status(statuses)
    counters = trainer.counters if trainer else {}
    step = int(counters.get("step", 0))
    elapsed = time.time() - started_at
    table = Table(
        title=(
            f"dockyard run — step {step}/{max_steps} — "
            f"reward {_fmt(counters.get('reward'))} — "
            f"val acc {_fmt(counters.get('val_accuracy'))} — "
            f"staleness {_fmt(counters.get('staleness'), 2)} — "
            f"{_fmt(counters.get('tokens_per_s'), 0)} tok/s — {elapsed:.0f}s"
        ),
        expand=False,
    )
    for column in ("role", "state", "detail", "progress", "heartbeat"):
        table.add_column(column)
    now = time.time()
    for status in statuses:
        age = now - status.updated_at_unix_s
        state = status.state if age < STALE_AFTER_S or status.state != "running" else "silent"
        progress = ", ".join(
            f"{key}={_fmt(value, 2)}"
            for key, value in status.counters.items()
            if key in ("groups", "weight_version", "step", "failures", "timeouts")
        )
        table.add_row(
            f"{status.role}-{status.instance}",
            state,
            status.detail[:60],
            progress,
            f"{age:.0f}s ago",
        )
    return table


def summary_line(status_dir: Path, started_at: float, max_steps: int) -> str:
    statuses = read_statuses(status_dir) if status_dir.exists() else []
    trainer = trainer_status(statuses)
    counters = trainer.counters if trainer else {}
    roles = " ".join(f"{s.role}-{s.instance}:{s.state}" for s in statuses)
    return (
        f"[{time.time() - started_at:5.0f}s] step {int(counters.get('step', 0))}/{max_steps} "
        f"reward {_fmt(counters.get('reward'))} val_acc {_fmt(counters.get('val_accuracy'))} "
        f"staleness {_fmt(counters.get('staleness'), 2)} | {roles}"
    )
