"""Episode checkouts of the sandbox service: multi-turn SWE agents work in a repository copy.

An episode opens a session: a sandbox session (its own tmpfs, uid, limits) holding a copy of the
repository snapshot, recorded as a base commit in a git directory *outside* the checkout (the
agent's commands cannot rewrite what its diff is taken against without also writing outside
its checkout — and that only spoils its own submission). The agent's tools are the shared file
tools (:mod:`dockyard.environments.tools.files`: ``bash``, ``read_file``, ``edit_file``,
``write_file``), each run inside the sandbox in the checkout. ``diff`` is the checkout's change
against the base as a unified diff: what the agent submits, scored as any generated patch is
(the service applies it to a pristine copy and checks its integrity: nothing the session did
counts but the diff).

At most ``max_sessions`` are open; one idle for ``idle_timeout_s`` is closed when another opens
(a worker that died leaves its sessions behind).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dockyard.environments.sandbox import Sandbox, SandboxResult, SandboxSession
from dockyard.environments.swe.protocol import SUBMISSION_TOO_LARGE
from dockyard.environments.tools.files import (
    BASH,
    EDIT_FILE,
    READ_FILE,
    WRITE_FILE,
    FileToolSettings,
    apply_call,
)
from dockyard.environments.tools.toolbox import ToolArgumentError
from dockyard.utils.logging import get_logger

logger = get_logger(__name__)

#: The tools a session runs; ``submit`` is the client's (it asks for the diff).
SESSION_TOOLS = (BASH, READ_FILE, EDIT_FILE, WRITE_FILE)
_CHECKOUT = "repo"
_BASE_GIT = "base.git"
# A fixed identity: the base commit is the service's, never the agent's configuration.
_GIT_IDENTITY = ("-c", "user.name=dockyard", "-c", "user.email=dockyard@localhost")


class SessionError(RuntimeError):
    """The session cannot be opened or is gone; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # for the client: whose failure it is (protocol.SUBMISSION_TOO_LARGE)


@dataclass
class _Checkout:
    context: contextlib.AbstractContextManager[SandboxSession]
    session: SandboxSession
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def path(self) -> Path:
        return self.session.directory / _CHECKOUT


class EpisodeCheckouts:
    """The open sessions of one service; safe to call from its request threads."""

    def __init__(
        self,
        sandbox: Sandbox,
        repos_dir: Path,
        git: str,
        *,
        shell: str = "bash",
        max_input_chars: int = 100_000,
        max_sessions: int = 64,
        idle_timeout_s: float = 1800.0,
    ) -> None:
        self.sandbox = sandbox
        self.repos_dir = repos_dir
        self.git = git
        self.settings = FileToolSettings(shell=shell, max_input_chars=max_input_chars)
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[str, _Checkout] = {}
        self.lock = threading.Lock()

    def open(self, repo: str, repos: list[str]) -> str:
        if repo not in repos:
            raise SessionError(422, f"unknown repo {repo!r}")
        self._close_idle()
        with self.lock:
            if len(self.sessions) >= self.max_sessions:
                raise SessionError(503, f"{self.max_sessions} sessions are open: try later")
        context = self.sandbox.session()
        session = context.__enter__()
        try:
            checkout = _Checkout(context, session)
            self._prepare(checkout, self.repos_dir / repo)
        except BaseException:
            context.__exit__(None, None, None)
            raise
        session_id = secrets.token_hex(16)
        with self.lock:
            self.sessions[session_id] = checkout
        logger.info("session opened", repo=repo, session=session_id[:8])
        return session_id

    def _prepare(self, checkout: _Checkout, snapshot: Path) -> None:
        shutil.copytree(snapshot, checkout.path, symlinks=True)
        checkout.session.give_to_sandbox(checkout.path)
        base = self._git(checkout, "init", "-q") and self._git(checkout, "add", "-A")
        if not base or not self._git(checkout, *_GIT_IDENTITY, "commit", "-q", "-m", "base"):
            raise SessionError(500, "recording the checkout's base commit failed")

    def _git(self, checkout: _Checkout, *args: str) -> bool:
        return self._run_git(checkout, *args).ok

    def _run_git(self, checkout: _Checkout, *args: str) -> SandboxResult:
        directory = checkout.session.directory
        return checkout.session.run(
            [self.git, f"--git-dir={directory / _BASE_GIT}", f"--work-tree={checkout.path}", *args],
            cwd=checkout.path,
            # Never discover (and obey) a repository above the session's directory.
            env={"GIT_CEILING_DIRECTORIES": str(directory)},
        )

    def _get(self, session_id: str) -> _Checkout:
        with self.lock:
            checkout = self.sessions.get(session_id)
        if checkout is None:
            raise SessionError(404, f"no session {session_id[:8]}… here")
        checkout.last_used = time.monotonic()
        return checkout

    def call(self, session_id: str, name: str, arguments: dict[str, Any]) -> str:
        """The tool's output; ToolArgumentError for a tool it has not or refused arguments."""
        if name not in SESSION_TOOLS:
            raise ToolArgumentError(f"no tool {name!r} (tools: {', '.join(SESSION_TOOLS)})")
        checkout = self._get(session_id)
        with checkout.lock:  # one call at a time: a session is one terminal
            return apply_call(checkout.session, name, arguments, self.settings, cwd=checkout.path)

    def diff(self, session_id: str) -> str:
        """The checkout's changes against its base commit (new files included), as a diff
        ``git apply`` takes from the repository root."""
        checkout = self._get(session_id)
        with checkout.lock:
            staged = self._run_git(checkout, "add", "-A")
            if not staged.ok:
                raise SessionError(500, "git add failed: " + staged.stderr.decode()[-300:])
            diffed = self._run_git(checkout, "-c", "core.quotepath=off", "diff", "--cached")
            if diffed.output_limit_exceeded:
                cap = self.sandbox.limits.max_output_bytes
                raise SessionError(
                    413, f"the diff is over the service's {cap}-byte cap", SUBMISSION_TOO_LARGE
                )
            if not diffed.ok:
                raise SessionError(500, "git diff failed: " + diffed.stderr.decode()[-300:])
            return str(diffed.stdout.decode("utf-8", errors="replace"))

    def close(self, session_id: str) -> None:
        with self.lock:
            checkout = self.sessions.pop(session_id, None)
        if checkout is not None:
            with checkout.lock:
                checkout.context.__exit__(None, None, None)

    def _close_idle(self) -> None:
        now = time.monotonic()
        with self.lock:
            idle = [s for s, c in self.sessions.items() if now - c.last_used > self.idle_timeout_s]
        for session_id in idle:
            logger.warning("session idle: closed", session=session_id[:8])
            self.close(session_id)

    def close_all(self) -> None:
        with self.lock:
            ids = list(self.sessions)
        for session_id in ids:
            self.close(session_id)
