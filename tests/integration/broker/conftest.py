"""The ``plane`` fixture runs each contract test against both implementations."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.memory import MemoryPlane
from dockyard.broker.plane import DataPlane
from dockyard.config.sections.data_plane import DataPlaneConfig


@pytest.fixture(params=["memory", "jetstream"])
async def plane(
    request: pytest.FixtureRequest,
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
) -> AsyncIterator[DataPlane]:
    config = data_plane_config_factory(nats_server.url)
    implementation: DataPlane = (
        MemoryPlane(config) if request.param == "memory" else JetStreamPlane(config)
    )
    async with implementation:
        yield implementation
