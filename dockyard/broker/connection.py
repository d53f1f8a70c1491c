"""Open a nats-py connection from a :class:`DataPlaneConfig` (URLs, credentials, TLS, buffers).

Reconnection is unbounded by count (a broker restart must not kill the fleet) but the client's
outbound buffer while disconnected is bounded by ``publish.max_buffered_bytes``: a publisher that
outruns a dead broker gets an error instead of growing without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NatsClient

from dockyard.broker.plane import DataPlaneError
from dockyard.config.sections.data_plane import DataPlaneConfig, TLSConfig
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_PERMISSION = re.compile(
    r"permissions violation for (publish|subscription) to \"?([^\"\s]+)\"?", re.IGNORECASE
)

RECONNECT_WAIT_S = 0.25
CONNECT_TIMEOUT_S = 5

#: The ASCII characters ``str.isspace`` accepts: nats-py skips a header name holding one.
_SPACE_IN_NAME = re.compile(
    b"[" + re.escape(bytes(c for c in range(128) if chr(c).isspace())) + b"]"
)


class DockyardClient(NatsClient):
    """nats-py's client with a faster header parser of the same result, and a hook for
    publishes that never went out.

    nats-py tests each character of each header name with a Python generator
    (``any(c.isspace() for c in key)``); with the four headers of every dockyard message that
    was a tenth of a consumer's transport time. Here one regular expression tests the name
    (``tests/unit/broker/test_connection_headers.py`` compares both parsers).

    A publish that raises before it went out (the outbound buffer full while reconnecting, a
    closed connection, a cancellation) is reported to ``unsent_listeners`` with its reply
    subject: JetStream's pipelined publishes wait on that subject for an ack that can never
    come (see ``jetstream_context.PipelinedJetStream``). A subclass, not a wrapper around the
    client: nats-py writes to its client's own state (an ordered consumer's reset takes the next
    subscription id), and a wrapper that forwarded attribute reads kept those writes to itself
    (issue #17).
    """

    def __init__(self) -> None:
        super().__init__()
        self.unsent_listeners: list[Callable[[str], None]] = []

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        try:
            await super().publish(subject, payload, reply=reply, headers=headers)
        except BaseException:
            if reply:
                for listener in self.unsent_listeners:
                    listener(reply)
            raise

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip()
            # nats-py: a name that is not ASCII, or holds whitespace, is skipped.
            if not name.isascii() or _SPACE_IN_NAME.search(name):
                continue
            out[name.decode("ascii")] = value.strip().decode("utf-8", "replace")
        return out


async def _open(options: dict[str, object]) -> DockyardClient:
    client = DockyardClient()
    await client.connect(**options)  # type: ignore[arg-type]  # options: nats connect's keyword arguments, of many types
    return client


class ConnectError(DataPlaneError):
    """The first connection failed: wrong credentials, or no server reachable in time."""


def tls_context(tls: TLSConfig) -> ssl.SSLContext | None:
    if not tls.enabled:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file if tls.ca_file else None
    )
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.cert_file and tls.key_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


@dataclass
class PermissionWatch:
    """Turns the server's asynchronous ``Permissions Violation`` into errors on the caller.

    nats-py reports a denied publish only to ``error_cb``; the publish itself would just time
    out. Publishers wait on :meth:`denied` next to their ack, so the denial surfaces at once.
    nats-py lowercases the server's message, subject included, so subjects are compared
    lowercased (``$JS.API.…`` or a namespace with capitals would otherwise never match).
    """

    waiters: dict[str, list[asyncio.Future[str]]] = field(default_factory=dict)
    last_denials: dict[str, str] = field(default_factory=dict)

    def record(self, message: str) -> bool:
        match = _PERMISSION.search(message)
        if match is None:
            return False
        subject = match.group(2).lower()
        self.last_denials[subject] = message
        for future in self.waiters.pop(subject, []):
            if not future.done():
                future.set_result(message)
        return True

    def denied(self, subject: str) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(subject.lower(), []).append(future)
        return future

    def forget(self, subject: str, future: asyncio.Future[str]) -> None:
        waiting = self.waiters.get(subject.lower())
        if waiting and future in waiting:
            waiting.remove(future)
            if not waiting:
                del self.waiters[subject.lower()]


@dataclass
class ConnectionEvents:
    permissions: PermissionWatch = field(default_factory=PermissionWatch)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False  # a disconnect we asked for is not worth a warning
    reconnects: int = 0
    on_reconnect: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _drop: asyncio.Future[None] | None = field(default=None, repr=False)

    def next_drop(self) -> asyncio.Future[None]:
        """Resolves when the connection in use drops (while disconnected: the next one).

        A request that went out on a connection that dropped is never answered: the reply
        went to the old connection, or the broker died with the request. Waiting for it
        alongside this, a publish or read is retried right after the reconnect instead of
        after its whole timeout.
        """
        if self._drop is None or self._drop.done():
            self._drop = asyncio.get_running_loop().create_future()
        return self._drop

    def dropped(self) -> None:
        if self._drop is not None and not self._drop.done():
            self._drop.set_result(None)


def server_urls(config: DataPlaneConfig, embedded_url: str | None = None) -> list[str]:
    if config.is_embedded:
        if embedded_url is None:
            raise ValueError("data_plane.url is 'embedded' but no embedded server was started")
        return [embedded_url]
    return [config.url] if isinstance(config.url, str) else list(config.url)


async def connect(
    config: DataPlaneConfig, urls: list[str], events: ConnectionEvents, *, name: str
) -> DockyardClient:
    credentials = config.credentials

    loop = asyncio.get_running_loop()
    auth_failed: asyncio.Future[str] = loop.create_future()

    async def on_error(error: Exception) -> None:
        if "authorization violation" in str(error).lower() and not auth_failed.done():
            auth_failed.set_result(str(error))
        if events.permissions.record(str(error)):
            log.error("nats.permission_denied", error=str(error))
        else:
            log.warning("nats.error", error=repr(error))

    async def on_disconnect() -> None:
        events.connected.clear()
        events.dropped()
        if not events.closing:
            log.warning("nats.disconnected", servers=urls)

    async def on_reconnect() -> None:
        events.connected.set()
        events.reconnects += 1
        log.info("nats.reconnected", servers=urls)
        for callback in events.on_reconnect:
            await callback()

    options: dict[str, object] = {
        "servers": urls,
        "name": name,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": RECONNECT_WAIT_S,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "pending_size": config.publish.max_buffered_bytes,
    }
    if credentials.user is not None:
        options["user"] = credentials.user
        options["password"] = credentials.password
    if credentials.token is not None:
        options["token"] = credentials.token
    if credentials.nkeys_seed_file is not None:
        options["nkeys_seed"] = credentials.nkeys_seed_file
    if credentials.creds_file is not None:
        options["user_credentials"] = credentials.creds_file
    context = tls_context(config.tls)
    if context is not None:
        options["tls"] = context
    # nats-py retries the *first* connection as long as reconnects (forever): bound it, and
    # stop at once on bad credentials instead of retrying them.
    connecting = asyncio.ensure_future(_open(options))
    racing: set[asyncio.Future[Any]] = {connecting, auth_failed}
    done, _ = await asyncio.wait(
        racing,
        timeout=config.connect_timeout_s,
        return_when=asyncio.FIRST_COMPLETED,
    )
    if connecting in done:
        client = connecting.result()
        events.connected.set()
        return client
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await connecting
    if auth_failed in done:
        who = f"user {credentials.user!r}" if credentials.user else "these credentials"
        raise ConnectError(f"the server at {urls} refused {who}: {auth_failed.result()}")
    raise ConnectError(
        f"cannot reach a NATS server at {urls} within {config.connect_timeout_s:g}s "
        f"(data_plane.connect_timeout_s)"
    )
