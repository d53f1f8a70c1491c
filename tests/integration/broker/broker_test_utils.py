"""Polling with a deadline (never sleep to synchronise) and small helpers for plane tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import yaml

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.names import ConsumerSpec, PlaneNames
from dockyard.broker.plane import DataPlane, Delivery, StoredMessage
from dockyard.broker.security import GeneratedCredentials
from dockyard.config.sections.data_plane import DataPlaneConfig

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout_s: float = 10.0, what: str = "condition"
) -> T:
    """Await ``probe()`` until it returns something truthy, or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.02)  # a polling interval, not a synchronisation point
    raise AssertionError(f"{what} not reached within {timeout_s}s (last: {last!r})")


async def fetch_until(
    plane: DataPlane, consumer: ConsumerSpec, count: int, *, timeout_s: float = 10.0
) -> list[Delivery]:
    deadline = time.monotonic() + timeout_s
    out: list[Delivery] = []
    while len(out) < count and time.monotonic() < deadline:
        out.extend(await plane.fetch(consumer, batch=count - len(out), timeout_s=0.5))
    return out


async def collect(plane: DataPlane, subject: str, **kwargs: object) -> list[StoredMessage]:
    return [message async for message in plane.replay(subject, **kwargs)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class SecuredBroker:
    """A server with the accounts and users of ``broker up --secure``, provisioned as the
    admin (as ``broker up`` does); ``config(role)`` is that role's generated settings."""

    server: EmbeddedNatsServer
    names: PlaneNames
    credentials: GeneratedCredentials
    make_config: Callable[..., DataPlaneConfig]

    def config(self, role: str, **overrides: object) -> DataPlaneConfig:
        fields = yaml.safe_load(self.credentials.files[role].read_text())["data_plane"]
        return self.make_config(
            self.server.url,
            namespace=self.names.namespace,
            publish={"timeout_s": 5.0, "retries": 0},
            **{**fields, **overrides},
        )
