"""nkey authentication: a real nats-server that knows only a user's public nkey; a plane with
the matching seed file connects and works, one with another seed is refused."""

from __future__ import annotations

import os

import nkeys
import pytest
from nats_jwt import operator_setup

from dockyard.broker.embedded import ServerUser
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import DataPlaneError


def new_user_seed(path) -> str:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    path.write_bytes(seed)
    path.chmod(0o600)
    return nkeys.from_seed(bytearray(seed)).public_key.decode()


async def test_nkey_credentials_authenticate(
    tmp_path, nats_server_factory, data_plane_config_factory
):
    public = new_user_seed(tmp_path / "trainer.nk")
    new_user_seed(tmp_path / "stranger.nk")
    server = nats_server_factory(users=(ServerUser(user="", password="", nkey=public),))
    good = data_plane_config_factory(
        server.url,
        credentials={"nkeys_seed_file": str(tmp_path / "trainer.nk")},
        connect_timeout_s=5,
    )
    async with JetStreamPlane(good) as plane:
        await plane.publish(plane.names.rollouts, b"signed", msg_id="m1")
        (delivery,) = await plane.fetch(plane.names.rollout_consumer, 1, timeout_s=5)
        assert delivery.data == b"signed"
    wrong = data_plane_config_factory(
        server.url,
        credentials={"nkeys_seed_file": str(tmp_path / "stranger.nk")},
        connect_timeout_s=2,
    )
    with pytest.raises(DataPlaneError):
        async with JetStreamPlane(wrong):
            pass


async def test_jwt_creds_file_authenticates_in_operator_mode(
    tmp_path, nats_server_factory, data_plane_config_factory
):
    """Decentralised auth: the server trusts an operator; a user JWT signed by an account of
    that operator, with its seed, in a ``.creds`` file (``data_plane.credentials.creds_file``)."""
    trusted = operator_setup(tmp_path / "trusted")
    foreign = operator_setup(tmp_path / "foreign")  # signed by an operator the server ignores
    server = nats_server_factory(extra=trusted.server_extra)
    good = data_plane_config_factory(
        server.url, credentials={"creds_file": str(trusted.creds_file)}, connect_timeout_s=5
    )
    async with JetStreamPlane(good) as plane:
        await plane.publish(plane.names.rollouts, b"jwt-signed", msg_id="m1")
        (delivery,) = await plane.fetch(plane.names.rollout_consumer, 1, timeout_s=5)
        assert delivery.data == b"jwt-signed"
    wrong = data_plane_config_factory(
        server.url, credentials={"creds_file": str(foreign.creds_file)}, connect_timeout_s=2
    )
    anonymous = data_plane_config_factory(server.url, connect_timeout_s=2)
    for refused in (wrong, anonymous):
        with pytest.raises(DataPlaneError, match="Authorization Violation"):
            async with JetStreamPlane(refused):
                pass
