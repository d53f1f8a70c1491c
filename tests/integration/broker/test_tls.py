"""The data plane over TLS: a real nats-server with a certificate from a throwaway CA (made with
openssl); a plane with `tls.ca_file` works end to end, one without TLS is refused clearly."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dockyard.broker.embedded import ServerTLS
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.plane import DataPlaneError


def make_certificates(directory: Path) -> ServerTLS:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    )
    return ServerTLS(
        cert_file=str(directory / "server.pem"),
        key_file=str(directory / "server.key"),
        ca_file=str(directory / "ca.pem"),
    )


async def test_the_plane_works_over_tls_and_plaintext_is_refused(
    tmp_path, nats_server_factory, data_plane_config_factory
):
    tls = make_certificates(tmp_path)
    server = nats_server_factory(tls=tls)
    assert server.url.startswith("tls://")
    secure = data_plane_config_factory(
        server.url, tls={"enabled": True, "ca_file": tls.ca_file}, connect_timeout_s=5
    )
    async with JetStreamPlane(secure) as plane:
        await plane.publish(plane.names.rollouts, b"over tls", msg_id="m1")
        (delivery,) = await plane.fetch(plane.names.rollout_consumer, 1, timeout_s=5)
        assert delivery.data == b"over tls"
        await delivery.ack()

    plaintext = data_plane_config_factory(
        server.url.replace("tls://", "nats://"), connect_timeout_s=2
    )
    with pytest.raises(DataPlaneError):
        async with JetStreamPlane(plaintext):
            pass


async def test_mutual_tls_needs_a_client_certificate(
    tmp_path, nats_server_factory, data_plane_config_factory
):
    tls = make_certificates(tmp_path)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=rollout-worker",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        "client.pem",
    )
    server = nats_server_factory(
        tls=ServerTLS(tls.cert_file, tls.key_file, tls.ca_file, verify_clients=True)
    )
    with_cert = data_plane_config_factory(
        server.url,
        tls={
            "enabled": True,
            "ca_file": tls.ca_file,
            "cert_file": str(tmp_path / "client.pem"),
            "key_file": str(tmp_path / "client.key"),
        },
        connect_timeout_s=5,
    )
    async with JetStreamPlane(with_cert) as plane:
        await plane.publish(plane.names.rollouts, b"mtls", msg_id="m1")
    without_cert = data_plane_config_factory(
        server.url, tls={"enabled": True, "ca_file": tls.ca_file}, connect_timeout_s=2
    )
    with pytest.raises(DataPlaneError):
        async with JetStreamPlane(without_cert):
            pass
