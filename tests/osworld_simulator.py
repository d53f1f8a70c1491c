"""A real ``dockyard osworld serve`` process for the tests (the desktop simulator service)."""

from __future__ import annotations

import sys


def simulator_command(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dockyard",
        "--log-format",
        "json",
        "osworld",
        "serve",
        "--port",
        "0",
        *extra,
    ]
