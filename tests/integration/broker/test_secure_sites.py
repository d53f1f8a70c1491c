"""Two sites started by ``dockyard broker up --secure`` (issue #24, ``docs/operations.md``,
"Multi-site", "Credentials across sites"): site A with ``--leafnodes`` writes one leaf user per
rollout site, site B joins it with ``--hub`` and that file. Each site has the per-role accounts
of the single-site secure mode; the leaf connection authenticates and joins the data accounts.
Every role, with its own site's credential and nothing more, does its cross-site part: the
trainer's prompt groups reach B's worker, B's scorer's experience reaches A's trainer, a weight
version put at A is read at B. A leaf with a wrong password is refused by A.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.messages import OutgoingMessage
from dockyard.broker.names import PlaneNames
from dockyard.broker.sites import LeafCredentials, leaf_remote
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.cli import main
from dockyard.commands._plane_args import plane_config
from dockyard.config.sections.data_plane import DataPlaneConfig
from tests.conftest import fresh_namespace
from tests.integration.broker.broker_test_utils import eventually, fetch_until
from tests.integration.broker.test_broker_cli import _start_broker_up, _stop, _wait_for_url
from tests.integration.broker.test_two_sites import _free_port
from tests.integration.e2e.conftest import QUICKSTART

pytestmark = pytest.mark.slow

SITE_A = ["data_plane.site.domain=a", "data_plane.site.rollout_domains=[b]"]
SITE_B = ["data_plane.site.domain=b", "data_plane.site.trainer_domain=a"]


def _role_config(url: str, store: Path, role: str, overrides: list[str]) -> DataPlaneConfig:
    """A role's settings at its site: the data plane ``broker up`` provisioned (the same config
    and overrides, so a role finds the streams as it would configure them) with the role's
    credential as ``broker up --secure`` wrote it."""
    base = plane_config(argparse.Namespace(config=str(QUICKSTART), overrides=overrides))
    fields = yaml.safe_load((store / "credentials" / f"{role}.yaml").read_text())["data_plane"]
    return DataPlaneConfig.model_validate({**base.model_dump(), "url": url, **fields})


def test_two_sites_run_with_role_credentials_and_an_authenticated_leaf(
    tmp_path: Path, nats_server_factory: Callable[..., EmbeddedNatsServer]
) -> None:
    namespace = fresh_namespace()
    names = PlaneNames(namespace)
    leaf_port = _free_port()
    common = ["--secure", "--port", "-1", "--config", str(QUICKSTART)]
    ns = f"data_plane.namespace={namespace}"
    overrides_a, overrides_b = [ns, *SITE_A], [ns, *SITE_B]
    store_a, store_b = tmp_path / "a", tmp_path / "b"
    hub = _start_broker_up(
        *common, "--store", str(store_a), "--leafnodes", f"127.0.0.1:{leaf_port}", *overrides_a
    )
    processes = [hub]
    try:
        url_a = _wait_for_url(hub)
        leaf_file = store_a / "credentials" / "leaf-b.yaml"
        assert leaf_file.stat().st_mode & 0o077 == 0  # a password: the owner's alone
        site_b = _start_broker_up(
            *common,
            "--store",
            str(store_b),
            "--hub",
            f"nats-leaf://127.0.0.1:{leaf_port}",
            "--leaf-credentials",
            str(leaf_file),
            *overrides_b,
        )
        processes.append(site_b)
        url_b = _wait_for_url(site_b)
        asyncio.run(
            _cross_site_work(
                names,
                trainer=_role_config(url_a, store_a, "trainer", overrides_a),
                rollout=_role_config(url_b, store_b, "rollout", overrides_b),
                scorer=_role_config(url_b, store_b, "scorer", overrides_b),
            )
        )

        # A leaf that does not know site b's password is refused by A.
        rogue = nats_server_factory(
            jetstream_extra={"domain": "c"},
            extra={
                "server_name": "rogue",
                "leafnodes": leaf_remote(
                    f"nats-leaf://127.0.0.1:{leaf_port}",
                    namespace,
                    LeafCredentials("leaf_b", "not-the-password"),
                ),
            },
        )

        async def refused() -> bool:
            return "authorization violation" in rogue.log_tail.lower()

        asyncio.run(eventually(refused, timeout_s=60, what="A refusing the rogue leaf"))
    finally:
        codes = [_stop(process) for process in processes]
    assert codes == [0] * len(processes)


async def _cross_site_work(
    names: PlaneNames,
    *,
    trainer: DataPlaneConfig,
    rollout: DataPlaneConfig,
    scorer: DataPlaneConfig,
) -> None:
    planes = [JetStreamPlane(c) for c in (trainer, rollout, scorer)]
    for plane in planes:
        await plane.start()  # checks its site's domain and the provisioned streams
    at_a, worker, scoring = planes
    try:
        await at_a.publish_many([OutgoingMessage(names.prompts, b"p", f"p-{i}") for i in range(4)])
        prompts = await fetch_until(worker, names.prompt_consumer, 4, timeout_s=60)
        assert sorted(str(d.msg_id) for d in prompts) == [f"p-{i}" for i in range(4)]
        await asyncio.gather(*(d.ack() for d in prompts))

        await scoring.publish(names.scored, b"scored group", msg_id="s-1")
        [scored] = await fetch_until(at_a, names.scored_consumer, 1, timeout_s=60)
        assert scored.data == b"scored group"
        await scored.ack()

        blob = bytes(range(256)) * 4096
        ref = await create_weight_store(at_a, reader_id="trainer").put(1, blob)
        await at_a.publish(names.weight_events, ref.uri.encode(), msg_id="weights-1")
        event = await eventually(worker.current_weight_event, timeout_s=60, what="v1 at B")
        assert event is not None and event.data == ref.uri.encode()
        assert await create_weight_store(worker, reader_id="w0").get_bytes(ref) == blob
        lag = await at_a.consumer_lag(names.prompt_consumer)  # the feeds' state, read at A
        assert lag.pending == 0
    finally:
        for plane in planes:
            await plane.close()


def test_a_secure_rollout_site_without_leaf_credentials_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            "broker",
            "up",
            "--secure",
            "--store",
            str(tmp_path),
            "--hub",
            "nats-leaf://127.0.0.1:7422",
            "--config",
            str(QUICKSTART),
            *SITE_B,
        ]
    )
    assert code == 2
    assert "--leaf-credentials" in capsys.readouterr().err
