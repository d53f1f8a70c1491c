"""GPU monitoring for the trainer (``logger.monitor_gpus``).

Every ``logger.gpu_monitoring.collection_interval`` seconds a thread reads every GPU the
trainer's machine shows; the trainer takes the readings with its step metrics once
``flush_interval`` seconds have passed since it last took them. Each metric is a series (every
reading since the last flush), so ``metrics.jsonl`` and W&B get it whole and the scalar
trackers get its mean/p50/p90/max::

    gpu/<index>/utilization_pct   gpu/<index>/memory_used_mib   gpu/<index>/memory_used_pct
    gpu/<index>/temperature_c     gpu/<index>/power_w

Readings come from ``nvidia-smi --query-gpu`` (installed with the NVIDIA driver, no Python
package needed); a value the GPU does not report (``[N/A]``) is left out of its series. Without
``nvidia-smi`` the trainer says so once and trains unmonitored. Only the trainer's own machine is
monitored: rollout hosts run their engines' own metrics.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dockyard.config.sections.logger import LoggerConfig
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: The ``--query-gpu`` fields, in the order ``nvidia-smi`` prints them.
QUERY_FIELDS = (
    "index",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "temperature.gpu",
    "power.draw",
)
QUERY_FORMAT = "csv,noheader,nounits"
#: A reading that hangs (a wedged driver) must not stall the monitor forever.
_READ_TIMEOUT_S = 10.0


class GpuMonitorError(RuntimeError):
    """``nvidia-smi`` failed, timed out or printed something that is not its query output."""


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float | None
    temperature_c: float | None
    power_w: float | None

    @property
    def memory_used_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return 100.0 * self.memory_used_mib / self.memory_total_mib

    def metrics(self) -> dict[str, float]:
        """The values this GPU reported, by metric name."""
        values = {
            "utilization_pct": self.utilization_pct,
            "memory_used_mib": self.memory_used_mib,
            "memory_used_pct": self.memory_used_pct,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
        }
        return {
            f"gpu/{self.index}/{name}": value for name, value in values.items() if value is not None
        }


def parse_query_output(text: str) -> list[GpuReading]:
    """The readings in ``nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits``
    output: one line per GPU, values separated by commas."""
    readings = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise GpuMonitorError(
                f"nvidia-smi printed {len(cells)} values where {len(QUERY_FIELDS)} "
                f"({', '.join(QUERY_FIELDS)}) were asked for: {line[:200]!r}"
            )
        index = _number(cells[0])
        if index is None or index != int(index):
            raise GpuMonitorError(f"nvidia-smi printed no GPU index: {line[:200]!r}")
        readings.append(GpuReading(int(index), *(_number(cell) for cell in cells[1:])))
    return readings


def _number(cell: str) -> float | None:
    """A value, or None for what the GPU does not report (``[N/A]``, ``[Not Supported]``)."""
    if cell.startswith("[") or cell in ("", "N/A"):
        return None
    try:
        value = float(cell)
    except ValueError:
        raise GpuMonitorError(
            f"nvidia-smi printed {cell[:64]!r} where a number was expected"
        ) from None
    return value if math.isfinite(value) else None


class NvidiaSmi:
    """Reads every GPU (or those of ``devices``, as ``CUDA_VISIBLE_DEVICES`` lists them: indices
    or UUIDs) with one ``nvidia-smi`` call."""

    def __init__(self, executable: str, devices: str | None = None) -> None:
        self.executable = executable
        self.devices = devices

    def read(self) -> list[GpuReading]:
        command = [self.executable]
        if self.devices:
            command.append(f"--id={self.devices}")
        command += [f"--query-gpu={','.join(QUERY_FIELDS)}", f"--format={QUERY_FORMAT}"]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=_READ_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise GpuMonitorError(f"{self.executable} did not answer: {error}") from error
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()[:300]
            raise GpuMonitorError(f"{self.executable} exited with {done.returncode}: {detail}")
        return parse_query_output(done.stdout)


class GpuMonitor:
    """Collects readings in a daemon thread (``start``/``stop``); ``take_due`` hands them out."""

    def __init__(
        self,
        sampler: NvidiaSmi,
        *,
        collection_interval_s: float,
        flush_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sampler = sampler
        self.collection_interval_s = collection_interval_s
        self.flush_interval_s = flush_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._series: dict[str, list[float]] = {}
        self._last_flush = clock()
        self._failing = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def collect_once(self) -> bool:
        """Take one reading of every GPU; False (logged once per run of failures) if it failed."""
        try:
            readings = self.sampler.read()
        except GpuMonitorError as error:
            if not self._failing:
                log.warning("gpu_monitor.read_failed", error=str(error))
            self._failing = True
            return False
        if self._failing:
            log.info("gpu_monitor.reading_again")
        self._failing = False
        with self._lock:
            for reading in readings:
                for name, value in reading.metrics().items():
                    self._series.setdefault(name, []).append(value)
        return True

    def take_due(self) -> dict[str, list[float]]:
        """The readings since the last flush once ``flush_interval_s`` has passed, else none."""
        now = self._clock()
        if now - self._last_flush < self.flush_interval_s:
            return {}
        self._last_flush = now
        with self._lock:
            series, self._series = self._series, {}
        return series

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=_READ_TIMEOUT_S + 1)
            self._thread = None

    def _run(self) -> None:
        while not self._stopping.wait(self.collection_interval_s):
            try:
                self.collect_once()
            except Exception:  # never let monitoring die silently (or take training with it)
                log.exception("gpu_monitor.crashed")
                return


def start_gpu_monitor(config: LoggerConfig) -> GpuMonitor | None:
    """A running monitor when ``config.monitor_gpus`` is on and this machine shows a GPU."""
    if not config.monitor_gpus:
        return None
    executable = shutil.which("nvidia-smi")
    if executable is None:
        log.warning(
            "gpu_monitor.unavailable",
            reason="logger.monitor_gpus is on but nvidia-smi is not on PATH; no GPU metrics",
        )
        return None
    # Only the GPUs this process may use, when it is told (a shared node); the metrics keep
    # nvidia-smi's numbering, which is the node's, not CUDA's renumbering from 0.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        log.warning("gpu_monitor.unavailable", reason="CUDA_VISIBLE_DEVICES hides every GPU")
        return None
    sampler = NvidiaSmi(executable, devices=visible.strip() if visible else None)
    try:
        first = sampler.read()
    except GpuMonitorError as error:
        log.warning("gpu_monitor.unavailable", reason=str(error))
        return None
    if not first:
        log.warning("gpu_monitor.unavailable", reason="nvidia-smi lists no GPU")
        return None
    settings = config.gpu_monitoring
    monitor = GpuMonitor(
        sampler,
        collection_interval_s=settings.collection_interval,
        flush_interval_s=settings.flush_interval,
    )
    monitor.start()
    log.info(
        "gpu_monitor.started",
        gpus=[reading.index for reading in first],
        every_s=settings.collection_interval,
    )
    return monitor
