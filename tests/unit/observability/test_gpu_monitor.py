"""GPU monitoring: nvidia-smi's query output, collection in a thread, flushes into the loggers.

This machine has no NVIDIA GPU, so ``nvidia-smi`` is a named stand-in (``tests/gpu_stand_in.py``)
that answers the monitor's query as the real tool does; everything else is the real code path.
"""

from __future__ import annotations

import json
import time

import pytest
from structlog.testing import capture_logs
from tracker_file_readers import read_tensorboard_scalars

from dockyard.config.sections.logger import LoggerConfig
from dockyard.observability.metrics import MetricsLogger
from dockyard.observability.metrics.gpu_monitor import (
    GpuMonitor,
    GpuMonitorError,
    NvidiaSmi,
    parse_query_output,
    start_gpu_monitor,
)
from tests.gpu_stand_in import install_nvidia_smi


def test_query_output_parses_with_unreported_values_left_out():
    readings = parse_query_output(
        "0, 87, 40321, 81559, 63, 512.35\n1, 0, 3, 81559, [N/A], [Not Supported]\n\n"
    )
    assert readings[0].metrics() == {
        "gpu/0/utilization_pct": 87.0,
        "gpu/0/memory_used_mib": 40321.0,
        "gpu/0/memory_used_pct": pytest.approx(100 * 40321 / 81559),
        "gpu/0/temperature_c": 63.0,
        "gpu/0/power_w": 512.35,
    }
    assert set(readings[1].metrics()) == {
        "gpu/1/utilization_pct",
        "gpu/1/memory_used_mib",
        "gpu/1/memory_used_pct",
    }


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("0, 87, 40321\n", "3 values where 6"),
        ("[N/A], 87, 1, 2, 3, 4\n", "no GPU index"),
        ("GPU0, 87, 1, 2, 3, 4\n", "'GPU0' where a number"),
        ("0, lots, 1, 2, 3, 4\n", "'lots' where a number"),
    ],
)
def test_output_that_is_not_the_querys_answer_is_refused(output, reason):
    with pytest.raises(GpuMonitorError, match=reason):
        parse_query_output(output)


def test_the_stand_in_answers_through_the_real_call(tmp_path):
    sampler = NvidiaSmi(str(install_nvidia_smi(tmp_path)))
    first, second = sampler.read(), sampler.read()
    assert [r.index for r in first] == [0, 1]
    assert [r.utilization_pct for r in first] == [5.0, 15.0]
    assert [r.utilization_pct for r in second] == [6.0, 16.0]
    assert first[1].power_w is None


def test_a_failing_tool_is_a_monitor_error_with_its_message(tmp_path):
    sampler = NvidiaSmi(str(install_nvidia_smi(tmp_path, fail=True)))
    with pytest.raises(GpuMonitorError, match="exited with 6: Invalid combination"):
        sampler.read()


def test_readings_are_handed_out_once_per_flush_interval(tmp_path):
    now = [100.0]
    monitor = GpuMonitor(
        NvidiaSmi(str(install_nvidia_smi(tmp_path))),
        collection_interval_s=1.0,
        flush_interval_s=10.0,
        clock=lambda: now[0],
    )
    assert monitor.collect_once() and monitor.collect_once()
    now[0] = 105.0
    assert monitor.take_due() == {}  # not due yet: the readings stay
    assert monitor.collect_once()
    now[0] = 110.0
    series = monitor.take_due()
    assert series["gpu/0/utilization_pct"] == [5.0, 6.0, 7.0]
    assert series["gpu/1/utilization_pct"] == [15.0, 16.0, 17.0]
    assert "gpu/1/power_w" not in series and len(series["gpu/0/power_w"]) == 3
    now[0] = 125.0
    assert monitor.take_due() == {}  # due, but nothing was read since


def test_failures_are_logged_once_per_run_of_them_and_training_goes_on(tmp_path):
    stand_in = tmp_path / "bin"
    monitor = GpuMonitor(
        NvidiaSmi(str(install_nvidia_smi(stand_in, fail=True))),
        collection_interval_s=1.0,
        flush_interval_s=0.0,
    )
    with capture_logs() as events:
        assert not monitor.collect_once()
        assert not monitor.collect_once()
        install_nvidia_smi(stand_in)  # the driver answers again
        assert monitor.collect_once()
    assert [e["event"] for e in events] == ["gpu_monitor.read_failed", "gpu_monitor.reading_again"]
    assert list(monitor.take_due()["gpu/0/utilization_pct"]) == [5.0]


def test_the_thread_collects_until_stopped(tmp_path):
    monitor = GpuMonitor(
        NvidiaSmi(str(install_nvidia_smi(tmp_path))),
        collection_interval_s=0.01,
        flush_interval_s=0.0,
    )
    monitor.start()
    deadline = time.monotonic() + 30
    collected: list[float] = []
    while len(collected) < 3 and time.monotonic() < deadline:  # polls a condition, with a limit
        collected += monitor.take_due().get("gpu/0/utilization_pct", [])
        time.sleep(0.01)
    monitor.stop()
    assert len(collected) >= 3
    assert collected == sorted(collected)  # each call of the stand-in reads one more
    calls = (tmp_path / "calls").read_text()
    monitor.collect_once()  # the thread is gone: only this call reads
    assert int((tmp_path / "calls").read_text()) == int(calls) + 1


def test_started_only_when_asked_and_a_gpu_answers(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert start_gpu_monitor(LoggerConfig(monitor_gpus=False)) is None
    with capture_logs() as events:
        assert start_gpu_monitor(LoggerConfig(monitor_gpus=True)) is None
    assert "nvidia-smi is not on PATH" in events[0]["reason"]

    install_nvidia_smi(tmp_path / "failing", fail=True)
    monkeypatch.setenv("PATH", str(tmp_path / "failing"))
    with capture_logs() as events:
        assert start_gpu_monitor(LoggerConfig(monitor_gpus=True)) is None
    assert "exited with 6" in events[0]["reason"]

    install_nvidia_smi(tmp_path / "gpus")
    monkeypatch.setenv("PATH", str(tmp_path / "gpus"))
    monitor = start_gpu_monitor(
        LoggerConfig(
            monitor_gpus=True,
            gpu_monitoring={"collection_interval": 5.0, "flush_interval": 7.0},
        )
    )
    assert monitor is not None
    try:
        assert (monitor.collection_interval_s, monitor.flush_interval_s) == (5.0, 7.0)
    finally:
        monitor.stop()


def test_flushed_series_reach_the_trackers_whole_or_summarised(tmp_path):
    monitor = GpuMonitor(
        NvidiaSmi(str(install_nvidia_smi(tmp_path / "bin"))),
        collection_interval_s=1.0,
        flush_interval_s=0.0,
    )
    for _ in range(4):
        monitor.collect_once()
    with MetricsLogger(LoggerConfig(tensorboard_enabled=True), tmp_path / "logs") as logger:
        logger.log_metrics({"train/loss": 1.0, **monitor.take_due()}, step=1)
    [record] = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").open()]
    assert record["metrics"]["gpu/0/utilization_pct"] == [5.0, 6.0, 7.0, 8.0]
    scalars = read_tensorboard_scalars(tmp_path / "logs" / "tensorboard")
    assert scalars["gpu/0/utilization_pct/max"] == [(1, 8.0)]
    assert scalars["gpu/0/utilization_pct/mean"] == [(1, 6.5)]


def test_only_the_gpus_cuda_may_use_are_read(tmp_path, monkeypatch):
    install_nvidia_smi(tmp_path, gpus=4)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    monitor = start_gpu_monitor(
        LoggerConfig(monitor_gpus=True, gpu_monitoring={"flush_interval": 1e-9})
    )
    assert monitor is not None
    try:
        monitor.stop()  # collect by hand from here
        assert monitor.collect_once()
        gpus = {name.split("/")[1] for name in monitor.take_due()}
        assert gpus == {"1", "3"}  # the node's numbering, as nvidia-smi prints it
    finally:
        monitor.stop()

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with capture_logs() as events:
        assert start_gpu_monitor(LoggerConfig(monitor_gpus=True)) is None
    assert "hides every GPU" in events[0]["reason"]


class ExplodingSampler(NvidiaSmi):
    """Stands in for a reading that fails in a way nobody planned for."""

    def read(self):
        raise RuntimeError("unplanned")


def test_an_unplanned_error_ends_monitoring_with_a_log_line_not_silently(tmp_path):
    monitor = GpuMonitor(
        ExplodingSampler("nvidia-smi"), collection_interval_s=0.01, flush_interval_s=0
    )
    with capture_logs() as events:
        monitor.start()
        thread = monitor._thread
        assert thread is not None
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert [e["event"] for e in events] == ["gpu_monitor.crashed"]
