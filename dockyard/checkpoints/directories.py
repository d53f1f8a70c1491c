"""Crash-safe checkpoint directories with top-k retention.

A checkpoint is written into ``tmp_step_N`` and renamed to ``step_N`` only when complete (with its
``checkpoint.json`` written last), so a crash mid-save never leaves a directory that looks whole.
What goes inside is the caller's business (model, optimizer, data position, ledger, ...).

Retention (the reference system's rule): always keep the latest checkpoint; keep the periodic ones
(``step % save_period == 0``) that rank in the top ``keep_top_k`` by ``metric_name``
(``higher_is_better``; ties go to the newer step; checkpoints without the metric rank last); and,
if ``keep_latest_k`` is set, the newest k as well.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dockyard.config.sections.checkpointing import CheckpointingConfig
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

METADATA_FILE = "checkpoint.json"
STEP_PREFIX = "step_"
TMP_PREFIX = "tmp_step_"


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    metrics: dict[str, float]
    created_at: float


class CheckpointManager:
    def __init__(self, config: CheckpointingConfig, root: Path | str | None = None) -> None:
        self.config = config
        # Without a root, the configured directory as seen from here (absolute, or cwd-relative).
        self.root = Path(root) if root is not None else config.directory(Path())
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_partial_saves()

    def _remove_partial_saves(self) -> None:
        for leftover in self.root.glob(f"{TMP_PREFIX}*"):
            log.warning("checkpoint.partial_save_removed", path=str(leftover))
            shutil.rmtree(leftover, ignore_errors=True)

    def save(
        self,
        step: int,
        write: Callable[[Path], None],
        metrics: Mapping[str, float] | None = None,
    ) -> CheckpointInfo:
        """Write a checkpoint for ``step`` with ``write(directory)``, then apply retention."""
        final = self.root / f"{STEP_PREFIX}{step}"
        staging = self.root / f"{TMP_PREFIX}{step}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        write(staging)
        info = CheckpointInfo(step, final, dict(metrics or {}), time.time())
        metadata = {"step": step, "metrics": info.metrics, "created_at": info.created_at}
        metadata_path = staging / METADATA_FILE
        metadata_path.write_text(json.dumps(metadata, indent=2, sort_keys=True))
        _fsync_tree(staging)
        if final.exists():
            shutil.rmtree(final)  # a re-save of the same step after a resume
        os.replace(staging, final)
        _fsync_dir(self.root)
        log.info("checkpoint.saved", step=step, path=str(final))
        self.apply_retention()
        return info

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        found = []
        for path in self.root.glob(f"{STEP_PREFIX}*"):
            metadata_path = path / METADATA_FILE
            if not metadata_path.is_file():
                continue
            metadata = json.loads(metadata_path.read_text())
            found.append(
                CheckpointInfo(
                    step=int(metadata["step"]),
                    path=path,
                    metrics={k: float(v) for k, v in metadata["metrics"].items()},
                    created_at=float(metadata["created_at"]),
                )
            )
        return sorted(found, key=lambda info: info.step)

    def latest(self) -> CheckpointInfo | None:
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    def to_keep(self, checkpoints: Sequence[CheckpointInfo]) -> set[int]:
        if not checkpoints:
            return set()
        keep = {checkpoints[-1].step}
        if self.config.keep_latest_k:
            keep.update(info.step for info in checkpoints[-self.config.keep_latest_k :])
        periodic = [info for info in checkpoints if info.step % self.config.save_period == 0]
        if self.config.keep_top_k is None:
            keep.update(info.step for info in periodic)
        else:
            keep.update(info.step for info in self._ranked(periodic)[: self.config.keep_top_k])
        return keep

    # Sequence, not list: in this class body `list` names the method above.
    def _ranked(self, checkpoints: Sequence[CheckpointInfo]) -> Sequence[CheckpointInfo]:
        metric = self.config.metric_name
        sign = 1.0 if self.config.higher_is_better else -1.0

        def rank_key(info: CheckpointInfo) -> tuple[int, float, int]:
            value = info.metrics.get(metric) if metric else None
            if value is None:
                return (1, 0.0, -info.step)
            return (0, -sign * value, -info.step)

        return sorted(checkpoints, key=rank_key)

    def apply_retention(self) -> None:
        checkpoints = self.list()
        keep = self.to_keep(checkpoints)
        for info in checkpoints:
            if info.step not in keep:
                shutil.rmtree(info.path, ignore_errors=True)
                log.info("checkpoint.removed", step=info.step)


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(root)
