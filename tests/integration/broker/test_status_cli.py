"""``dockyard status`` against a real nats-server: the fleet as the data plane alone shows it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.heartbeats import HeartbeatPublisher
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import StoredMessage
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.observability.status_files import StatusFile
from tests.conftest import make_data_plane_config
from tests.integration.roles.factories import prompt_group


async def _a_small_fleet(config: DataPlaneConfig) -> None:
    """Three prompts waiting, a trainer and a worker beating, three dead letters."""
    async with JetStreamPlane(config) as plane:
        await MessagePlane(plane, stage="trainer").publish_many(
            [prompt_group(f"g{i}") for i in range(3)]
        )
        trainer = StatusFile(None, "trainer", "0")
        trainer.update("running", step=7, weight_version=7)
        await HeartbeatPublisher(plane, trainer).beat()
        worker = StatusFile(None, "rollout", "gpu-node.lan-99")
        worker.update("running", weight_version=6)
        await HeartbeatPublisher(plane, worker).beat()
        for seq, (stage, reason) in enumerate(
            [("scorer", "env_error"), ("scorer", "env_error"), ("rollout", "schema_mismatch")]
        ):
            original = StoredMessage("s", "x.y", seq + 1, _now(), {}, b"bad")
            await plane.publish_dead_letter(original, reason, "detail", stage=stage)


def _now():  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.now(UTC)


@pytest.fixture
def fleet(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: Callable[..., DataPlaneConfig]
) -> DataPlaneConfig:
    config = data_plane_config_factory(nats_server.url)
    asyncio.run(_a_small_fleet(config))
    return config


def _status(config: DataPlaneConfig, *extra: str) -> list[str]:
    return ["status", "--url", config.url, "--namespace", config.namespace, *extra]


def test_status_json_shows_roles_lag_and_dead_letters(
    fleet: DataPlaneConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_status(fleet, "--json")) == 0
    view = json.loads(capsys.readouterr().out)
    roles = {(r["role"], r["instance"]): r for r in view["roles"]}
    assert set(roles) == {("trainer", "0"), ("rollout", "gpu-node.lan-99")}
    assert roles[("trainer", "0")]["weight_version"] == 7
    assert roles[("trainer", "0")]["counters"] == {"step": 7}
    assert roles[("rollout", "gpu-node.lan-99")]["weight_version"] == 6
    assert not roles[("trainer", "0")]["silent"]
    streams = {s["name"]: s for s in view["streams"]}
    [prompts] = streams[f"{fleet.namespace}_prompts"]["consumers"]
    assert (prompts["pending"], prompts["ack_pending"], prompts["backlog"]) == (3, 0, 3)
    assert streams[f"{fleet.namespace}_prompts"]["messages"] == 3
    dead = view["dead_letters"]
    assert (dead["stored"], dead["counted"]) == (3, 3)
    assert dead["by_stage_and_reason"] == [
        {"stage": "scorer", "reason": "env_error", "count": 2},
        {"stage": "rollout", "reason": "schema_mismatch", "count": 1},
    ]


def test_status_counts_only_the_newest_dead_letters_when_asked(
    fleet: DataPlaneConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_status(fleet, "--json", "--dead-letters", "1")) == 0
    dead = json.loads(capsys.readouterr().out)["dead_letters"]
    assert (dead["stored"], dead["counted"]) == (3, 1)
    assert dead["by_stage_and_reason"] == [
        {"stage": "rollout", "reason": "schema_mismatch", "count": 1}
    ]


def test_status_table_names_every_role_and_stream(
    fleet: DataPlaneConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_status(fleet)) == 0
    out = capsys.readouterr().out
    for text in ("trainer", "gpu-node.lan-99", f"{fleet.namespace}_prompts", "env_error"):
        assert text in out


def test_status_refuses_an_embedded_url(capsys: pytest.CaptureFixture[str]) -> None:
    # The quickstart's data plane is an embedded server: a new, empty one, not the run's.
    quickstart = str(Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml")
    assert main(["status", "--config", quickstart]) == 1
    assert "status reads a running broker" in capsys.readouterr().err
    # Nothing to read at all: it says what it can read.
    assert main(["status"]) == 1
    assert "give --config or --url (a running fleet), or --run-dir" in capsys.readouterr().err


def test_a_broker_provisioned_before_heartbeats_is_shown_without_roles(
    fleet: DataPlaneConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    async def forget_heartbeats() -> None:
        async with JetStreamPlane(fleet, provision=False) as plane:
            await plane.js.delete_stream(plane.names.heartbeats_stream.name)

    asyncio.run(forget_heartbeats())
    assert main(_status(fleet, "--json")) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["roles"] == []
    assert view["notes"] == [
        f"no stream {fleet.namespace}_heartbeats: this broker was provisioned before roles "
        "published heartbeats"
    ]
    assert view["dead_letters"]["stored"] == 3  # the rest of the view is there


def test_status_shows_a_finished_run_from_its_own_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `dockyard run` leaves with an embedded broker: its store and resolved config; the
    README's promise that `dockyard status` shows a finished run."""
    run_dir = tmp_path / "run"
    server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=run_dir / "nats"))
    try:
        config = make_data_plane_config(server.start(), streams={"storage": "file"})
        asyncio.run(_a_small_fleet(config))
    finally:
        server.stop()
    section = {"url": "embedded", "namespace": config.namespace, "streams": {"storage": "file"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"data_plane": section}))

    assert main(["status", "--run-dir", str(run_dir), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert {(r["role"], r["instance"]) for r in view["roles"]} == {
        ("trainer", "0"),
        ("rollout", "gpu-node.lan-99"),
    }
    assert view["dead_letters"]["stored"] == 3
    streams = {s["name"]: s for s in view["streams"]}
    assert streams[f"{config.namespace}_prompts"]["messages"] == 3


def test_status_of_a_run_without_a_store_of_its_own_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"data_plane": None}))
    assert main(["status", "--run-dir", str(run_dir)]) == 1
    assert "no broker store of its own" in capsys.readouterr().err
    assert main(["status", "--run-dir", str(tmp_path / "nosuch")]) == 1
    assert "no such directory" in capsys.readouterr().err
