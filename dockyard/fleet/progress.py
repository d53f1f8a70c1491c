"""The live view of a run: per-role health and the trainer's latest numbers."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from dockyard.observability.status_files import RoleStatus, read_statuses

STALE_AFTER_S = 30.0
#: Without a terminal (a log file, CI), one summary line this often instead of the live table.
PLAIN_PROGRESS_EVERY_S = 10.0


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or value < 0:
        return "–"
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def trainer_status(statuses: list[RoleStatus]) -> RoleStatus | None:
    return next((s for s in statuses if s.role == "trainer"), None)


def render(status_dir: Path, started_at: float, max_steps: int) -> Group:
    """The headline (the trainer's latest numbers) over one row per role."""
    statuses = read_statuses(status_dir) if status_dir.exists() else []
    trainer = trainer_status(statuses)
    counters = trainer.counters if trainer else {}
    step = int(counters.get("step", 0))
    elapsed = time.time() - started_at
    # A line of its own, not the table's title: a title wraps at the table's width, and the
    # table is narrow while the roles have little to say.
    headline = Text(
        f"dockyard run — step {step}/{max_steps} — "
        f"reward {_fmt(counters.get('reward'))} — "
        f"val acc {_fmt(counters.get('val_accuracy'))} — "
        f"staleness {_fmt(counters.get('staleness'), 2)} — "
        f"{_fmt(counters.get('tokens_per_s'), 0)} tok/s — {elapsed:.0f}s",
        style="bold",
    )
    table = Table(expand=False)
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
    return Group(headline, table)


def _role_word(status: RoleStatus) -> str:
    word = f"{status.role}-{status.instance}:{status.state}"
    # The trainer's detail is its phase, shown by the step; another role's says what is wrong.
    if status.detail and status.role != "trainer":
        word += f" ({status.detail[:60]})"
    return word


def summary_line(status_dir: Path, started_at: float, max_steps: int) -> str:
    statuses = read_statuses(status_dir) if status_dir.exists() else []
    trainer = trainer_status(statuses)
    counters = trainer.counters if trainer else {}
    roles = " ".join(_role_word(s) for s in statuses)
    return (
        f"[{time.time() - started_at:5.0f}s] step {int(counters.get('step', 0))}/{max_steps} "
        f"reward {_fmt(counters.get('reward'))} val_acc {_fmt(counters.get('val_accuracy'))} "
        f"staleness {_fmt(counters.get('staleness'), 2)} | {roles}"
    )


def validation_line(status_dir: Path) -> str | None:
    """``validation accuracy A → B``: the trainer's first and latest validation, once it has
    reported both (the trainer's own summary line says the same in its log)."""
    statuses = read_statuses(status_dir) if status_dir.exists() else []
    trainer = trainer_status(statuses)
    counters = trainer.counters if trainer else {}
    start, end = counters.get("val_accuracy_start"), counters.get("val_accuracy")
    if start is None or end is None:
        return None
    return f"validation accuracy {_fmt(start)} → {_fmt(end)}"


@dataclass(frozen=True)
class RunFiles:
    """Where a run keeps what its end-of-run lines read (``logger.log_dir`` may move the
    metrics) and the config it was started with."""

    metrics: Path
    config: Path


def zero_reward_line(files: RunFiles) -> str | None:
    """Said when every trained step's reward was 0: the policy may not be there yet, or the
    reward path may be broken; the oracle tells which (``dockyard oracle``)."""
    if not files.metrics.is_file():
        return None
    rewards = []
    for line in files.metrics.read_text().splitlines():
        try:
            value = json.loads(line).get("metrics", {}).get("train/reward_mean")
        except (ValueError, AttributeError):
            continue  # a line cut by a kill: the others still say what happened
        if value is not None:
            rewards.append(float(value))
    if not rewards or any(rewards):
        return None
    return (
        f"reward 0 at every one of the {len(rewards)} steps: `dockyard oracle --config "
        f"{files.config}` scores the data's reference answers through this run's "
        "environments (a reward there means the reward path works and the policy has not "
        "learnt the task)"
    )


class ProgressDisplay:
    """The run's progress on stderr, from the roles' status files: a live table on a terminal,
    a summary line every ``PLAIN_PROGRESS_EVERY_S`` otherwise. Whoever watches the roles calls
    :meth:`refresh` as often as it looks at them (both ways of running a fleet use this)."""

    def __init__(
        self,
        status_dir: Path,
        max_steps: int,
        console: Console | None = None,
        run_files: RunFiles | None = None,
    ) -> None:
        self.status_dir = status_dir
        self.max_steps = max_steps
        self.run_files = run_files
        self.started_at = time.time()
        self.console = console if console is not None else Console(stderr=True)
        self._live: Live | None = None
        self._last_line = 0.0

    def __enter__(self) -> ProgressDisplay:
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=2)
            self._live.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._live is not None:
            # The table left on screen is the run's last word: read the roles once more, or it
            # shows them as of the last poll (still "running" after they stopped).
            self._live.update(self._table())
            self._live.__exit__(kind, error, traceback)
            self._live = None

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._table())
        elif time.time() - self._last_line >= PLAIN_PROGRESS_EVERY_S:
            self.console.print(self.summary(), markup=False, highlight=False, soft_wrap=True)
            self._last_line = time.time()

    def summary(self) -> str:
        return summary_line(self.status_dir, self.started_at, self.max_steps)

    def final_summary(self) -> str:
        """The last word of a run: its summary line, how validation accuracy moved, and what
        to try when no step earned any reward."""
        lines = [self.summary(), validation_line(self.status_dir)]
        if self.run_files is not None:
            lines.append(zero_reward_line(self.run_files))
        return "\n".join(line for line in lines if line is not None)

    def _table(self) -> Group:
        return render(self.status_dir, self.started_at, self.max_steps)
