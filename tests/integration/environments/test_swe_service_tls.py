"""The sandbox service beyond loopback, as an attacker on the network would meet it (issue #20):
TLS so the token and patches are not readable on the wire, client certificates (mutual TLS) so
a stranger cannot even talk to it, and a refusal to listen beyond loopback in clear.

Certificates are made with the ``openssl`` command line (a CA, the service's certificate for
127.0.0.1, a client certificate signed by the CA, and one signed by a stranger's CA)."""

from __future__ import annotations

import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from swe_repo import BUGGY, FIXED, POLICY, make_calc
from swe_repo import diff as _diff

from dockyard.config.sections.env import SWEEnvConfig
from dockyard.environments import EnvironmentContext, SampleInput, ScoringGroup, build_environment
from tests.sandbox_service import sandbox_service, serve_command

TOKEN = "tls-test-token-for-the-sandbox"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}-ca.pem", directory / f"{name}-ca.key"
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"),
        *("-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name} CA"),
        *("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=keyCertSign"),
    )
    key.chmod(0o600)
    return cert, key


def _issue(directory: Path, name: str, ca: tuple[Path, Path], extension: str) -> tuple[Path, Path]:
    cert, key, request = (directory / f"{name}{suffix}" for suffix in (".pem", ".key", ".csr"))
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"),
        *("-keyout", str(key), "-out", str(request), "-subj", f"/CN={name}"),
    )
    extensions = directory / f"{name}.ext"
    extensions.write_text(extension + "\n")
    _openssl(
        *("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1])),
        *("-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions)),
    )
    key.chmod(0o600)
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    ca, stranger = _make_ca(directory, "fleet"), _make_ca(directory, "stranger")
    server = _issue(directory, "service", ca, "subjectAltName=IP:127.0.0.1")
    client = _issue(directory, "scorer", ca, "extendedKeyUsage=clientAuth")
    intruder = _issue(directory, "intruder", stranger, "extendedKeyUsage=clientAuth")
    token = directory / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    return {
        "ca": ca[0],
        "server_cert": server[0],
        "server_key": server[1],
        "client_cert": client[0],
        "client_key": client[1],
        "intruder_cert": intruder[0],
        "intruder_key": intruder[1],
        "token": token,
        "policy": policy,
    }


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_calc(tmp_path_factory.mktemp("repos"))


@pytest.fixture(scope="module")
def tls_url(repos: Path, pki: dict[str, Path]) -> Iterator[str]:
    command = serve_command(
        repos,
        pki["policy"],
        *("--token-file", str(pki["token"])),
        *("--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"])),
        *("--tls-client-ca", str(pki["ca"])),
        *("--wall-time-s", "30", "--cpu-time-s", "10", "--memory-mb", "512"),
    )
    with sandbox_service(command, env={"DOCKYARD_SANDBOX_TOKEN": ""}, start_timeout_s=60) as url:
        yield url


def _context(pki: dict[str, Path], client: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    if client is not None:
        context.load_cert_chain(pki[f"{client}_cert"], pki[f"{client}_key"])
    return context


def test_the_service_speaks_only_tls(tls_url: str) -> None:
    assert tls_url.startswith("https://127.0.0.1:")
    with pytest.raises(httpx.HTTPError):  # the token would cross in clear: no answer
        httpx.get(tls_url.replace("https://", "http://") + "/healthz", timeout=5)


@pytest.mark.parametrize("client", [None, "intruder"])
def test_clients_without_a_certificate_of_the_fleet_are_refused(
    tls_url: str, pki: dict[str, Path], client: str | None
) -> None:
    """With the right token but no client certificate, or one from another CA: no handshake."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{tls_url}/healthz", headers=headers, verify=_context(pki, client), timeout=5)


def test_a_scorer_that_does_not_know_the_fleet_ca_does_not_trust_the_service(
    tls_url: str, pki: dict[str, Path]
) -> None:
    """The system's CAs did not sign the service's certificate: a man in the middle with any
    certificate would be refused the same way, so the token is never sent to it."""
    context = ssl.create_default_context()
    context.load_cert_chain(pki["client_cert"], pki["client_key"])
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{tls_url}/healthz", verify=context, timeout=5)


async def test_the_fleet_scorer_scores_over_mutual_tls(tls_url: str, pki: dict[str, Path]) -> None:
    context = EnvironmentContext()
    context.env.swe = SWEEnvConfig(
        sandbox_urls=[tls_url],
        sandbox_token_file=str(pki["token"]),
        sandbox_ca_file=str(pki["ca"]),
        sandbox_client_cert_file=str(pki["client_cert"]),
        sandbox_client_key_file=str(pki["client_key"]),
        task_timeout=60,
    )
    environment = build_environment("swe", context)
    group = ScoringGroup(
        group_id="tls-1",
        env_name="swe",
        prompt_text="Fix add().",
        samples=[SampleInput(_diff("calc/__init__.py", BUGGY, FIXED))],
        ground_truth={"repo": "calc"},
    )
    try:
        score = await environment.score(group)
    finally:
        await environment.aclose()
    assert score.rewards == [1.0]


def _start(repos: Path, pki: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    """The service's start-up, expected to be refused (``--host`` in ``extra``)."""
    environ = {key: value for key, value in os.environ.items() if key != "DOCKYARD_SANDBOX_TOKEN"}
    return subprocess.run(
        serve_command(repos, pki["policy"], *extra),
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
    )


def test_listening_beyond_loopback_in_clear_is_refused(repos: Path, pki: dict[str, Path]) -> None:
    finished = _start(repos, pki, "--token-file", str(pki["token"]), "--host", "0.0.0.0")
    assert finished.returncode == 1
    assert "refusing to listen on 0.0.0.0 over plain HTTP" in finished.stderr


@pytest.mark.slow
def test_a_readable_tls_key_is_refused(repos: Path, pki: dict[str, Path], tmp_path: Path) -> None:
    key = tmp_path / "service.key"
    key.write_bytes(pki["server_key"].read_bytes())
    key.chmod(0o644)
    finished = _start(
        repos,
        pki,
        *("--token-file", str(pki["token"]), "--tls-cert", str(pki["server_cert"])),
        *("--tls-key", str(key)),
    )
    assert finished.returncode == 1
    assert "private key" in finished.stderr and "readable by others" in finished.stderr
