"""``docker-compose.yml`` describes the same deployment as ``dockyard run``: a JetStream broker
with a volume, then trainer, rollout and scorer services. No Docker engine runs here, so the
file is checked against the CLI it calls: every command parses, and its config validates."""

from __future__ import annotations

from pathlib import Path

import yaml

from dockyard.cli import build_parser
from dockyard.config.loader import load_config

ROOT = Path(__file__).resolve().parents[3]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_broker_service_runs_jetstream_with_a_persistent_volume():
    services = compose()["services"]
    nats = services["nats"]
    assert "-js" in nats["command"]
    store = nats["command"][nats["command"].index("-sd") + 1]
    assert any(volume.endswith(f":{store}") for volume in nats["volumes"])
    assert store.strip("/") and "nats-data" in compose()["volumes"]
    config_mount = next(v for v in nats["volumes"] if v.endswith("nats.conf:ro"))
    assert (ROOT / config_mount.split(":")[0]).is_file()


def test_every_role_service_is_a_valid_dockyard_command():
    services = compose()["services"]
    parser = build_parser()
    roles = {}
    for name, service in services.items():
        if name == "nats":
            continue
        args = parser.parse_args(service["command"])
        roles[args.command] = args
        assert "nats" in service["depends_on"]
        config = load_config(ROOT / args.config, args.overrides)
        assert config.data_plane is not None
        assert config.data_plane.url == "nats://nats:4222"
    assert set(roles) == {"trainer", "rollout", "score"}


def test_the_image_installs_the_package_and_runs_the_cli():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dockyard"' in dockerfile
    assert "COPY configs" in dockerfile and "pip install" in dockerfile
