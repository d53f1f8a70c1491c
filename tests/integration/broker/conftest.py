"""The ``plane`` fixture runs each contract test against both implementations."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from broker_test_utils import SecuredBroker

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.memory import MemoryPlane
from dockyard.broker.names import PlaneNames
from dockyard.broker.plane import DataPlane
from dockyard.broker.security import generate_credentials
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


@pytest.fixture
def http_directory(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real HTTP server (stdlib) serving a directory, as a deployment's web server would."""
    directory = tmp_path / "served"
    directory.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", directory
    finally:
        server.shutdown()
        server.server_close()


#: Every weight transport, each over the plane it runs with.
BLOB_TRANSPORTS = ["jetstream", "filesystem", "http", "memory"]


@pytest.fixture(params=BLOB_TRANSPORTS)
async def blob_plane(
    request: pytest.FixtureRequest,
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    tmp_path: Path,
    http_directory: tuple[str, Path],
) -> AsyncIterator[Callable[..., AsyncIterator[DataPlane]]]:
    """``async with blob_plane(**weight_transport) as plane``: a started plane whose
    ``weight_transport`` is this parameter's kind plus the given settings."""
    kind = request.param

    @contextlib.asynccontextmanager
    async def open_plane(**transport: object) -> AsyncIterator[DataPlane]:
        if kind == "filesystem":
            transport.update(kind="filesystem", path=str(tmp_path / "blobs"))
        elif kind == "http":
            transport.update(kind="http", base_url=http_directory[0], path=str(http_directory[1]))
        config = data_plane_config_factory(nats_server.url, weight_transport=transport)
        plane = MemoryPlane(config) if kind == "memory" else JetStreamPlane(config)
        async with plane:
            yield plane

    yield open_plane


@pytest.fixture
async def secured_broker(
    nats_server_factory: Callable[..., EmbeddedNatsServer],
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    tmp_path: Path,
) -> SecuredBroker:
    names = PlaneNames("secured")
    credentials = generate_credentials(names, tmp_path / "credentials")
    server = nats_server_factory(accounts=credentials.accounts)
    broker = SecuredBroker(server, names, credentials, data_plane_config_factory)
    async with JetStreamPlane(broker.config("admin")):
        pass  # start() provisions the streams and durables
    return broker
