"""Structured logging, configured once per process.

Console rendering on a terminal, JSON lines otherwise; stdlib loggers (httpx, nats, vLLM) are
bridged through structlog's ``ProcessorFormatter`` so every line of a process has one format.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import structlog

from dockyard.utils.private_files import create_private_file, private_dir

LogFormat = Literal["auto", "console", "json"]

_configured: tuple[str, int] | None = None


def _resolve_format(log_format: LogFormat) -> Literal["console", "json"]:
    if log_format != "auto":
        return log_format
    return "console" if sys.stderr.isatty() else "json"


def configure_logging(log_format: LogFormat = "auto", level: int | str = logging.INFO) -> None:
    """Set up structlog and the stdlib root logger. Idempotent for identical arguments."""
    global _configured
    resolved = _resolve_format(log_format)
    numeric_level = logging.getLevelName(level) if isinstance(level, str) else level
    if _configured == (resolved, numeric_level):
        return

    structlog.configure(
        processors=[*_shared_processors(), structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(resolved))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric_level)
    _configured = (resolved, numeric_level)


def _shared_processors() -> list[structlog.types.Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _formatter(resolved: Literal["console", "json"]) -> logging.Formatter:
    """The last step of every line, structlog's and stdlib's alike (event dict -> text)."""
    pre_chain = _shared_processors()
    final: list[structlog.types.Processor] = [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta
    ]
    if resolved == "json":
        # Here rather than in structlog's chain, so a JSON file handler renders tracebacks
        # whatever the console's format (the console renderer prints exc_info itself).
        pre_chain.append(structlog.processors.format_exc_info)
        final += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        final.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    return structlog.stdlib.ProcessorFormatter(foreign_pre_chain=pre_chain, processors=final)


@contextlib.contextmanager
def logging_to_file(path: Path) -> Iterator[None]:
    """Every log line of this process goes to ``path`` (JSON lines, appended) instead of
    stderr while the block runs: for ``dockyard run`` in one process, whose stderr is the
    progress display, as each role process of a fleet logs to its own file."""
    private_dir(path.parent)
    create_private_file(path)  # a run's logs are its owner's only, like its config
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_formatter("json"))
    root = logging.getLogger()
    previous = root.handlers
    root.handlers = [handler]
    try:
        yield
    finally:
        root.handlers = previous
        handler.close()


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; use ``structlog.contextvars.bind_contextvars`` for per-role context."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
