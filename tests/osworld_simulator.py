"""A real ``dockyard osworld serve`` process for the tests (the desktop simulator service);
run it with :func:`tests.sandbox_service.sandbox_service`."""

from __future__ import annotations

from tests.sandbox_service import dockyard_command


def simulator_command(*extra: str) -> list[str]:
    return dockyard_command("osworld", "serve", "--port", "0", *extra)
