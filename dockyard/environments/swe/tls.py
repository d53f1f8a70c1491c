"""TLS between the scorers and a sandbox service that listens beyond loopback.

Beyond loopback the bearer token and every patch cross the network: without TLS anyone on the
path reads the token and can then run jobs. The service takes a certificate and key
(``--tls-cert``/``--tls-key``) and, for mutual TLS, the CA its clients' certificates must chain to
(``--tls-client-ca``); the scorers take the CA that signed the service's certificate
(``env.swe.sandbox_ca_file``) and their own certificate and key
(``env.swe.sandbox_client_cert_file``/``sandbox_client_key_file``). TLS 1.2 is the minimum.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from dockyard.environments.swe.auth import TokenError, refuse_if_readable_by_others


class TLSSetupError(ValueError):
    """A TLS file cannot be used; the message names the file and why."""


def _load_chain(context: ssl.SSLContext, cert_file: str | Path, key_file: str | Path) -> None:
    try:
        refuse_if_readable_by_others(Path(key_file), "private key")
    except TokenError as error:
        raise TLSSetupError(str(error)) from None
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as error:
        raise TLSSetupError(f"certificate {cert_file} / key {key_file}: {error}") from None


def _load_ca(context: ssl.SSLContext, ca_file: str | Path) -> None:
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as error:
        raise TLSSetupError(f"CA file {ca_file}: {error}") from None


def server_context(
    cert_file: str | Path, key_file: str | Path, client_ca_file: str | Path | None = None
) -> ssl.SSLContext:
    """The service's context; with ``client_ca_file`` a client without a certificate signed by
    that CA fails the handshake (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert_file, key_file)
    if client_ca_file is not None:
        _load_ca(context, client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(
    ca_file: str | Path | None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
) -> ssl.SSLContext:
    """The scorer's context: the service's certificate checked against ``ca_file`` (else the
    system's CAs), its host name checked, and the client certificate offered if given."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file is not None:
        _load_ca(context, ca_file)
    if (cert_file is None) != (key_file is None):
        raise TLSSetupError("a client certificate needs both its certificate and its key file")
    if cert_file is not None and key_file is not None:
        _load_chain(context, cert_file, key_file)
    return context
