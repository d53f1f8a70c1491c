"""``dockyard broker up`` and ``dockyard replay`` against real servers."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import WeightVersion
from tests.integration.roles.factories import prompt_group

_READY = re.compile(r"nats-server ready at (\S+)")


def _start_broker_up(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dockyard.cli", "--log-format", "json", "broker", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_url(process: subprocess.Popen[str], timeout_s: float = 30) -> str:
    return _wait_for_ready(process, timeout_s)[0]


def _wait_for_ready(process: subprocess.Popen[str], timeout_s: float = 30) -> tuple[str, str]:
    """The URL ``broker up`` serves, and everything it printed up to its ready line."""
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    printed: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            raise AssertionError(f"broker up exited: {process.stderr.read()}")  # type: ignore[union-attr]
        printed.append(line)
        match = _READY.search(line)
        if match:
            return match.group(1), "".join(printed)
    raise AssertionError("broker up printed no URL")


def _stop(process: subprocess.Popen[str]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@pytest.mark.slow
def test_broker_up_serves_a_provisioned_jetstream_and_stops_cleanly(tmp_path: Path) -> None:
    process = _start_broker_up("--store", str(tmp_path / "store"), "--port", "-1")
    try:
        url = _wait_for_url(process)

        async def check() -> list[str]:
            config = DataPlaneConfig(url=url)
            async with JetStreamPlane(config, provision=False) as plane:
                return [state.name for state in await plane.streams()]

        assert "dockyard_experience" in asyncio.run(check())
    finally:
        code = _stop(process)
    assert code == 0
    assert (tmp_path / "store" / "jetstream").is_dir()


QUICKSTART = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"
MiB = 1024 * 1024


def _stream_limits(url: str) -> dict[str, int]:
    """Every stream's max_bytes on the server at ``url`` (namespace ``dockyard``)."""

    async def run() -> dict[str, int]:
        async with JetStreamPlane(DataPlaneConfig(url=url), provision=False) as plane:
            return {
                spec.name: (await plane.js.stream_info(spec.name)).config.max_bytes
                for spec in plane.names.all_streams()
            }

    return asyncio.run(run())


def _serve(store: Path, *args: str) -> tuple[dict[str, int], str]:
    """``broker up --store STORE ARGS``: the streams' max_bytes it serves and what it printed
    before it was ready; then stopped."""
    process = _start_broker_up("--store", str(store), "--port", "-1", *args)
    try:
        url, printed = _wait_for_ready(process)
        return _stream_limits(url), printed
    finally:
        assert _stop(process) == 0


@pytest.mark.slow
def test_serving_an_existing_store_never_changes_its_limits(tmp_path: Path) -> None:
    # Issue 44: `broker up --store DIR`, the documented way to replay a finished run, raised
    # every stream's max_bytes to the default config's. A run's store is served as it is.
    store = tmp_path / "store"
    run_config = ["--config", str(QUICKSTART), f"data_plane.streams.max_bytes={256 * MiB}"]
    as_run, _ = _serve(store, *run_config)
    assert as_run["dockyard_experience"] == 256 * MiB

    served, printed = _serve(store)  # the default config, whose limits differ
    assert DataPlaneConfig().streams.max_bytes != 256 * MiB
    assert served == as_run
    assert "dockyard_experience keeps its limits" in printed  # reported, not silent
    assert "--update-limits" in printed

    # Changing them is an explicit act, and said.
    changed, printed = _serve(store, "--update-limits")
    assert changed["dockyard_experience"] == DataPlaneConfig().streams.max_bytes
    assert f"dockyard_experience: max_bytes {256 * MiB} -> " in printed


@pytest.mark.slow
def test_broker_up_refuses_limits_its_disk_cannot_hold_before_creating_anything(
    tmp_path: Path, nats_server_factory: Callable[..., EmbeddedNatsServer]
) -> None:
    store = tmp_path / "store"
    pebibyte = 1 << 50  # per stream: more than any disk holds
    process = _start_broker_up(
        "--store",
        str(store),
        "--port",
        "-1",
        "--config",
        str(QUICKSTART),
        f"data_plane.streams.max_bytes={pebibyte}",
    )
    try:
        code = process.wait(timeout=60)
        stderr = process.stderr.read()  # type: ignore[union-attr]
    finally:
        _stop(process)
    assert code == 2, stderr
    # docs/operations.md: JetStream reserves each file stream's max_bytes up front — six
    # streams at data_plane.streams.max_bytes, the heartbeats at 64 MiB, the blobs nothing — and
    # nats-server lets its streams reserve at most three quarters of the store's free disk.
    needed = 6 * pebibyte + 64 * MiB
    assert f"{needed} bytes" in stderr
    assert "free" in stderr and "data_plane.streams.max_bytes" in stderr
    # Nothing was created: served again, the store holds no stream.
    server = nats_server_factory(store_dir=store)

    async def stream_names() -> list[str | None]:
        async with JetStreamPlane(DataPlaneConfig(url=server.url), provision=False) as plane:
            return [info.config.name for info in await plane.js.streams_info()]

    assert asyncio.run(stream_names()) == []


def test_broker_up_on_a_taken_port_fails_clearly(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    process = _start_broker_up("--store", str(tmp_path), "--port", str(nats_server.port))
    try:
        code = process.wait(timeout=30)
        stderr = process.stderr.read()  # type: ignore[union-attr]
    finally:
        _stop(process)
    assert code == 3
    assert f"port {nats_server.port} is already in use" in stderr


def _publish_samples(config: DataPlaneConfig) -> None:
    async def run() -> None:
        async with JetStreamPlane(config) as plane:
            typed = MessagePlane(plane, stage="test")
            for version in (1, 2):
                await typed.publish(
                    WeightVersion(
                        version=version,
                        step=version * 10,
                        blob_ref=f"nats-blob://x/{version}",
                        digest="sha256:" + f"{version:064x}",
                        nbytes=123,
                        created_at_unix_s=1.0,
                        producer_id="trainer",
                    )
                )
            await plane.publish(plane.names.scored, b"not a zstd frame", msg_id="junk")

    asyncio.run(run())


def test_replay_ls_show_and_export(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # a terminal of 80 columns, whatever runs the suite
    config = data_plane_config_factory(nats_server.url)
    _publish_samples(config)
    target = ["--url", nats_server.url, "--namespace", config.namespace]

    assert main(["replay", "ls", *target]) == 0
    listing = capsys.readouterr().out
    # The namespace once, in the title; the names people copy into `replay show` in the rows,
    # in 80 columns.
    assert f"streams of namespace {config.namespace}" in listing
    rows = [line.split() for line in listing.splitlines()]
    assert ["weights", "2"] in [row[:2] for row in rows]  # the stream and its two events
    assert ["scored", "experience"] in [row[:2] for row in rows]  # a consumer with its lag
    # (the table's own lines start with a space or its rule; log lines may be interleaved)
    table = listing[listing.index("streams of namespace") :].splitlines()
    assert all(len(line) <= 80 for line in table if line.startswith((" ", "─"))), table
    # The newest message's time: the weight events were published just now (today, UTC).
    today = {(datetime.now(UTC) - timedelta(minutes=m)).date().isoformat() for m in (0, 10)}
    assert any(day in listing for day in today), listing

    assert main(["replay", "show", "--subject", "weights", "--from-seq", "2", *target]) == 0
    shown = capsys.readouterr().out
    assert "weight_version" in shown and "123 B" in shown
    assert shown.count("weight_version") == 1  # from seq 2: only version 2

    assert main(["replay", "show", "--subject", "scored", *target]) == 0
    assert "<undecodable>" in capsys.readouterr().out

    out = tmp_path / "weights.jsonl"
    assert main(["replay", "export", "--subject", "weights", "--out", str(out), *target]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["message"]["version"] for r in records] == [1, 2]
    assert all(r["schema"] == "weight_version" for r in records)

    junk = tmp_path / "scored.jsonl"
    assert main(["replay", "export", "--subject", "scored", "--out", str(junk), *target]) == 0
    [record] = [json.loads(line) for line in junk.read_text().splitlines()]
    assert record["error"]["reason"] and record["payload_base64"]


def test_replay_refuses_an_embedded_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "ls"]) == 1
    assert "replay reads a running broker" in capsys.readouterr().err


def test_replay_with_a_dead_url_fails_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    dead = ["--url", "nats://127.0.0.1:1", "--connect-timeout", "1"]
    assert main(["replay", "ls", *dead]) == 1
    assert "cannot reach a NATS server" in capsys.readouterr().err


def _dead_letter_two(config: DataPlaneConfig) -> None:
    """Two scored messages a consumer refused, for two different reasons."""

    async def run() -> None:
        async with JetStreamPlane(config) as plane:
            names = plane.names
            await plane.publish(names.scored, b"refused for its version", msg_id="orig-v")
            await plane.publish(
                names.scored, b"refused as corrupt", msg_id="orig-c", headers={"X-Trace": "t1"}
            )
            first, second = await plane.fetch(names.scored_consumer, 2, timeout_s=5)
            await plane.dead_letter(first, "unsupported_version", "reads 1.x", stage="trainer")
            await plane.dead_letter(second, "corrupt_frame", "not zstd", stage="trainer")

    asyncio.run(run())


def _scored_after(config: DataPlaneConfig, seq: int) -> list[tuple[bytes, dict[str, str]]]:
    async def run() -> list[tuple[bytes, dict[str, str]]]:
        async with JetStreamPlane(config) as plane:
            return [
                (m.data, dict(m.headers))
                async for m in plane.replay(plane.names.scored, from_seq=seq)
            ]

    return asyncio.run(run())


def test_replay_requeue_republishes_dead_letters_once(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = data_plane_config_factory(nats_server.url)
    _dead_letter_two(config)
    target = ["--url", nats_server.url, "--namespace", config.namespace]

    assert main(["replay", "requeue", "--dry-run", *target]) == 0
    assert "dry run: 2 to re-queue, 0 cannot be" in capsys.readouterr().out
    assert _scored_after(config, 3) == []  # a dry run publishes nothing

    assert main(["replay", "requeue", "--reason", "unsupported_version", *target]) == 0
    assert "re-queued 1 dead letters" in capsys.readouterr().out
    [(data, headers)] = _scored_after(config, 3)
    assert data == b"refused for its version"
    assert re.fullmatch(r"requeue:\d+:orig-v", headers["Nats-Msg-Id"])

    assert main(["replay", "requeue", *target]) == 0  # both now: one is already back
    out = capsys.readouterr().out
    assert "re-queued 1 dead letters (1 already re-queued within the dedupe window)" in out
    requeued = _scored_after(config, 3)
    assert [data for data, _ in requeued] == [b"refused for its version", b"refused as corrupt"]
    assert requeued[1][1]["X-Trace"] == "t1"  # the original headers travel with it


def test_replay_show_names_an_unknown_subject_and_filters_one_group(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = data_plane_config_factory(nats_server.url)

    async def publish() -> None:
        async with JetStreamPlane(config) as plane:
            await MessagePlane(plane, stage="test").publish_many(
                [prompt_group(f"group-{i}") for i in range(4)]
            )

    asyncio.run(publish())
    target = ["--url", nats_server.url, "--namespace", config.namespace]

    assert main(["replay", "show", "--subject", "nosuch", *target]) == 1
    err = capsys.readouterr().err
    assert f"--subject nosuch: no stream of namespace '{config.namespace}' holds it" in err
    assert "KeyError" not in err  # it used to end in a traceback of the lookup

    assert main(["replay", "show", "--subject", "prompts", "--group", "group-2", *target]) == 0
    shown = capsys.readouterr().out
    assert "(1 messages)" in shown and "group-2" in shown
    assert not any(f"group-{i}" in shown for i in (0, 1, 3))
