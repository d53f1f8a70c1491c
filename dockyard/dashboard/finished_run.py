"""A finished run's own broker: ``dockyard run`` with ``url: embedded`` keeps its JetStream
store in the run directory, and the dashboard can read it again by starting a server on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.config.sections.data_plane import DataPlaneConfig

#: What ``dockyard run`` writes into the run directory: the resolved config.
RUN_CONFIG = "config.yaml"


@dataclass(frozen=True)
class StoredPlane:
    store_dir: Path
    config: DataPlaneConfig


def stored_plane(run_dir: Path) -> StoredPlane | None:
    """The embedded broker store of a finished run, with its data plane config; None when the
    run had none (``data_plane: null``, or a broker of its own elsewhere)."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    section = (yaml.safe_load(path.read_text()) or {}).get("data_plane")
    if not section:
        return None
    config = DataPlaneConfig.model_validate(section)
    if not config.is_embedded:
        return None
    store = Path(config.embedded.store_dir or run_dir / "nats")
    return StoredPlane(store, config) if store.is_dir() else None


def start_stored_server(stored: StoredPlane) -> tuple[EmbeddedNatsServer, DataPlaneConfig]:
    """A server on the finished run's store (on a free port), and the config that reaches it.
    Never on the store of a run still going: two servers must not share one store."""
    server = EmbeddedNatsServer(
        EmbeddedServerSettings(
            store_dir=stored.store_dir,
            max_payload=stored.config.max_payload,
            max_pending=stored.config.max_pending,
        )
    )
    url = server.start()
    return server, stored.config.model_copy(update={"url": url})
