"""Structured logging: one format per process, stdlib loggers (nats, httpx, vLLM) bridged."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import logging, structlog
from dockyard.utils.logging import configure_logging, get_logger
configure_logging("{fmt}", "INFO")
structlog.contextvars.bind_contextvars(worker_id="w7")
get_logger("dockyard.test").info("from.structlog", weight_version=3)
logging.getLogger("httpx").warning("from stdlib %s", "httpx")
logging.getLogger("noisy").debug("below the level")
"""


def run(fmt: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(fmt=fmt)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_json_lines_for_structlog_and_bridged_stdlib_logs():
    records = [json.loads(line) for line in run("json")]
    assert [r["event"] for r in records] == ["from.structlog", "from stdlib httpx"]
    structured, bridged = records
    assert structured["weight_version"] == 3 and structured["worker_id"] == "w7"
    assert structured["level"] == "info" and structured["logger"] == "dockyard.test"
    assert bridged["level"] == "warning" and bridged["logger"] == "httpx"
    assert bridged["worker_id"] == "w7"  # context variables reach stdlib records too
    assert all("timestamp" in r for r in records)


def test_console_rendering_is_human_readable():
    lines = run("console")
    assert len(lines) == 2
    assert "from.structlog" in lines[0] and "weight_version=3" in lines[0]
    assert "from stdlib httpx" in lines[1]
    assert not lines[0].startswith("{")
