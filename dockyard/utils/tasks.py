"""Background tasks that never fail unobserved.

A task whose exception nobody retrieves only surfaces as asyncio's "Task exception was never
retrieved" when it is garbage-collected (a scorer died of it, issue #17). Every background task
of a role is either awaited by its owner or started with :func:`spawn`, whose done-callback
logs the failure with the task's name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from dockyard.utils.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")


def log_failure(task: asyncio.Task[Any]) -> None:
    """Done-callback: a task that raised is logged (which also marks its error as seen)."""
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("task.failed", task=task.get_name(), error=repr(error), exc_info=error)


def spawn(coroutine: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """``asyncio.create_task`` whose failure is logged when it happens, not lost."""
    task = asyncio.create_task(coroutine, name=name)
    task.add_done_callback(log_failure)
    return task
