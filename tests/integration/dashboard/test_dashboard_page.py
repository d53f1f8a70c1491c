"""``dockyard dashboard`` loaded in a real headless Chromium (issue #26): the charts drawn from
``metrics.jsonl`` with the values the run wrote, the roles' health, the streams, the dead letters
and their browser, live over a real nats-server and on a finished run's own broker store.

Expected values come from what the test wrote and the definitions in docs/operations.md (idle
fraction = wait / (wait + train + publish); the staleness histogram sums each step's samples at
each age), never from the page's own output.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.heartbeats import HeartbeatPublisher
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import StoredMessage
from dockyard.broker.typed import MessagePlane
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.observability.metrics.jsonl_backend import JsonlBackend
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import encode
from tests.conftest import fresh_namespace, make_data_plane_config
from tests.integration.dashboard.browser import Node, load, screenshot
from tests.integration.roles.factories import prompt_group

# The loss is small and negative, as a GRPO loss often is: its axis labels are the widest.
STEPS = {  # step: (reward, loss, tokens/s, wait_s, train_s, publish_s, {age: samples})
    1: (0.1, -0.0183, 100.0, 1.0, 3.0, 0.0, {0: 4}),
    2: (0.3, -0.0121, 200.0, 3.0, 0.5, 0.5, {0: 2, 1: 2}),
    3: (0.5, -0.0007, 300.0, 1.0, 2.0, 1.0, {1: 3, 2: 1}),
}
VALIDATION = {0: 0.2, 2: 0.4}


def _write_run(run_dir: Path) -> None:
    metrics = JsonlBackend(run_dir)
    metrics.log_metrics({"val/accuracy": VALIDATION[0]}, step=0)
    for step, (reward, loss, tps, wait, train, publish, ages) in STEPS.items():
        record = {
            "train/reward_mean": reward,
            "loss/loss": loss,
            "train/tokens_per_s": tps,
            "timing/wait_for_data_s": wait,
            "timing/train_step_s": train,
            "timing/publish_weights_s": publish,
            **{f"staleness/samples_at_age_{age}": float(n) for age, n in ages.items()},
        }
        if step in VALIDATION:
            record["val/accuracy"] = VALIDATION[step]
        metrics.log_metrics(record, step=step)
    metrics.close()
    StatusFile(run_dir / "status", "trainer", "0").update("running", step=3, weight_version=3)
    StatusFile(run_dir / "status", "rollout", "w0").update("running", weight_version=2)


def _points(page: Node, chart: str) -> list[tuple[float, float]]:
    return [
        (float(c.attrs["data-step"]), float(c.attrs["data-value"]))
        for c in page.by_id(f"chart-{chart}").find_all("circle", "point")
    ]


def _assert_y_labels_fit(page: Node) -> None:
    """Every y-axis label starts inside its chart (issue #42, item 6: "-0.0183" showed as
    "0183"): right-aligned at ``x``, a label of the width the browser measured starts at
    ``x - width``, which must not be left of the chart's edge (0)."""
    labels = [
        label
        for chart in page.find_all("div", "chart")
        for label in chart.find_all("text", "axis")
        if "data-width" in label.attrs
    ]
    assert {label.text() for label in labels} >= {"-0.0183", "-0.0007"}
    for label in labels:
        width = float(label.attrs["data-width"])
        assert width > 0, label.text()  # measured: the page was laid out
        assert float(label.attrs["x"]) - width >= 0, (label.text(), label.attrs)


@pytest.mark.slow
def test_the_charts_and_roles_of_a_run_directory(tmp_path: Path, dashboard) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    _write_run(run_dir)
    with dashboard("--run-dir", str(run_dir)) as running:
        page = load(running.url)
        png = screenshot(running.url, tmp_path / "page.png")

    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert _points(page, "reward") == [(s, v[0]) for s, v in STEPS.items()]
    assert _points(page, "loss") == [(s, v[1]) for s, v in STEPS.items()]
    assert _points(page, "tokens_per_s") == [(s, v[2]) for s, v in STEPS.items()]
    assert _points(page, "val_accuracy") == list(VALIDATION.items())
    idle = [(s, v[3] / (v[3] + v[4] + v[5])) for s, v in STEPS.items()]
    assert _points(page, "trainer_idle_fraction") == pytest.approx(idle)
    _assert_y_labels_fit(page)
    bars = page.by_id("chart-staleness").find_all("rect", "bar")
    histogram = {int(b.attrs["data-age"]): float(b.attrs["data-samples"]) for b in bars}
    assert histogram == {0: 4 + 2, 1: 2 + 3, 2: 1}
    roles = {(row[0], row[1]): row for row in page.by_id("roles").rows()}
    assert set(roles) == {("trainer", "0"), ("rollout", "w0")}
    assert roles[("trainer", "0")][2] == "running" and roles[("trainer", "0")][4] == "3"
    assert "status files" in page.by_id("source").text()


REASONS = [("rollout", "schema_mismatch"), ("scorer", "env_error"), ("scorer", "env_error")]


async def _fleet_on(config: DataPlaneConfig) -> None:
    """Two roles beating, two prompts waiting, three dead letters of a real prompt group."""
    async with JetStreamPlane(config) as plane:
        await MessagePlane(plane, stage="trainer").publish_many(
            [prompt_group("waiting-1"), prompt_group("waiting-2")]
        )
        trainer = StatusFile(None, "trainer", "0")
        trainer.update("running", weight_version=5)
        await HeartbeatPublisher(plane, trainer).beat()
        await HeartbeatPublisher(plane, StatusFile(None, "scorer", "s0")).beat()
        for index, (stage, reason) in enumerate(REASONS):
            encoded = encode(prompt_group(f"bad-{index}"))
            original = StoredMessage(
                plane.names.prompts_stream.name,
                plane.names.prompts,
                100 + index,
                datetime.now(UTC),
                encoded.headers,
                encoded.payload,
            )
            await plane.publish_dead_letter(original, reason, f"detail {index}", stage=stage)


def _check_fleet(page: Node, namespace: str) -> None:
    roles = {(row[0], row[1]): row for row in page.by_id("roles").rows()}
    assert set(roles) == {("trainer", "0"), ("scorer", "s0")}
    assert roles[("trainer", "0")][4] == "5"
    streams = page.by_id("streams").rows()
    assert [namespace + "_prompts", "", "2"] == streams[0][:3]
    assert ["", f"{namespace}_prompts", "", "", "2", "0", "0"] == streams[1]
    counts = page.by_id("dead-counts").rows()
    assert counts == [["scorer", "env_error", "2"], ["rollout", "schema_mismatch", "1"]]


@pytest.mark.slow
def test_a_live_fleet_with_its_dead_letters_paged(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    dashboard,  # type: ignore[no-untyped-def]
) -> None:
    config = data_plane_config_factory(nats_server.url)
    asyncio.run(_fleet_on(config))
    target = ("--url", config.url, "--namespace", config.namespace)
    with dashboard(*target) as running:
        newest = load(f"{running.url}?dead_size=2")
        # The newest page ended at seq 2 (3 stored, 2 a page): the older one is before it.
        older = load(f"{running.url}?dead_size=2&dead_before=2")

    _check_fleet(newest, config.namespace)
    rows = newest.by_id("dead-letters").rows()
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
        ("3", "scorer", "env_error", "detail 2"),
        ("2", "scorer", "env_error", "detail 1"),
    ]
    # The refused message itself, decoded by the replay decoder: its subject, seq and group.
    assert rows[0][5] == f"{config.namespace}.prompts #102 (prompt_group)"
    assert rows[0][6] == "bad-2"
    assert "disabled" not in newest.by_id("dead-older").attrs
    [only] = older.by_id("dead-letters").rows()
    assert only[:4] == ["1", only[1], "rollout", "schema_mismatch"]
    assert "disabled" in older.by_id("dead-older").attrs  # the oldest page


@pytest.mark.slow
def test_a_finished_runs_own_broker_store(tmp_path: Path, dashboard) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    _write_run(run_dir)
    namespace = fresh_namespace()
    server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=run_dir / "nats"))
    try:
        url = server.start()
        config = make_data_plane_config(url, namespace=namespace, streams={"storage": "file"})
        asyncio.run(_fleet_on(config))
    finally:
        server.stop()
    # What `dockyard run` leaves: its resolved config, the broker it started being embedded.
    section = {"url": "embedded", "namespace": namespace, "streams": {"storage": "file"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"data_plane": section}))

    with dashboard("--run-dir", str(run_dir)) as running:
        page = load(running.url)
    # The server the dashboard started on the store is gone with it.
    [started] = [
        json.loads(line) for line in running.stderr.splitlines() if '"nats_server.started"' in line
    ]
    assert not Path(f"/proc/{started['pid']}").exists()

    _check_fleet(page, namespace)
    assert len(page.by_id("dead-letters").rows()) == 3
    assert _points(page, "reward") == [(s, v[0]) for s, v in STEPS.items()]
