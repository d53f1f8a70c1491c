"""Structured logging, configured once per process.

Console rendering on a terminal, JSON lines otherwise; stdlib loggers (httpx, nats, vLLM) are
bridged through structlog's ``ProcessorFormatter`` so every line of a process has one format.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

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

    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if resolved == "json":
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric_level)
    _configured = (resolved, numeric_level)


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; use ``structlog.contextvars.bind_contextvars`` for per-role context."""
    return structlog.get_logger(name)
