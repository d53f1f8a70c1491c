"""The multi-turn ``swe`` toolbox: an agent fixes a repository in a checkout of the sandbox
service (``dockyard sandbox serve``), then submits its change.

An episode opens a session on one of ``env.swe.sandbox_urls`` (a fresh checkout of the task's
``repo``); its tools run there (:mod:`dockyard.environments.swe.sessions`): ``bash``,
``read_file``, ``edit_file``, ``write_file`` — the shared file tools — and ``submit``, which
answers the checkout's diff. The reward is the last submitted diff's, scored by the ``swe``
environment exactly as a generated patch is (the early header check, then the service applies it
to a pristine copy, checks what it changed and runs the tests): the session itself counts for
nothing but that diff. A service that cannot be reached fails the episode
(:class:`ToolServiceUnavailable`), never the model.
"""

from __future__ import annotations

import contextlib
import ssl
import zlib
from collections.abc import Mapping
from typing import Any

import httpx

from dockyard.config.sections.env import EnvConfig, SWEEnvConfig
from dockyard.environments.swe.environment import SUBMIT_TOOL, service_access
from dockyard.environments.swe.protocol import (
    BAD_ARGUMENTS,
    SESSION_CALL_PATH,
    SESSION_CLOSE_PATH,
    SESSION_DIFF_PATH,
    SESSIONS_PATH,
    SUBMISSION_TOO_LARGE,
)
from dockyard.environments.tools.files import BASH, EDIT_FILE, FILE_TOOLS, READ_FILE, WRITE_FILE
from dockyard.environments.tools.toolbox import (
    NO_TASK,
    TaskRefused,
    ToolArgumentError,
    Toolbox,
    ToolServiceUnavailable,
    ToolSession,
    register_toolbox,
)

SUBMIT = SUBMIT_TOOL
SUBMIT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SUBMIT,
        "description": "Submit your change: answers the diff of the checkout, which is graded "
        "by running the repository's tests. The last submission counts.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
SWE_TOOLS = (BASH, READ_FILE, EDIT_FILE, WRITE_FILE, SUBMIT)
_CONNECT_TIMEOUT_S = 5.0


class SWESession(ToolSession):
    def __init__(self, toolbox: SWEToolbox, url: str, session_id: str) -> None:
        self.toolbox = toolbox
        self.url = url
        self.session_id = session_id

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset(SWE_TOOLS)

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        if name == SUBMIT:
            if arguments:
                raise ToolArgumentError("takes no arguments")
            reply = await self.toolbox.post(self.url, SESSION_DIFF_PATH, self._body())
            return str(reply["patch"])
        body = {**self._body(), "name": name, "arguments": dict(arguments)}
        reply = await self.toolbox.post(self.url, SESSION_CALL_PATH, body)
        return str(reply["output"])

    def _body(self) -> dict[str, Any]:
        return {"session_id": self.session_id}

    async def aclose(self) -> None:
        # A service that is gone took the checkout with it.
        with contextlib.suppress(ToolServiceUnavailable):
            await self.toolbox.post(self.url, SESSION_CLOSE_PATH, self._body())


@register_toolbox
class SWEToolbox(Toolbox):
    name = "swe"

    def __init__(self, settings: SWEEnvConfig) -> None:
        if not settings.sandbox_urls:
            raise ValueError("env.swe.sandbox_urls is empty: the swe tools run in the service")
        self.settings = settings
        self.headers, self.tls = service_access(settings)
        self._client: httpx.AsyncClient | None = None

    @classmethod
    def from_env_config(cls, env: EnvConfig) -> SWEToolbox:
        return cls(env.swe)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return [*(FILE_TOOLS[name].schema() for name in SWE_TOOLS[:-1]), SUBMIT_SCHEMA]

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            verify: ssl.SSLContext | bool = self.tls
            self._client = httpx.AsyncClient(verify=verify)
        return self._client

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        repo = task.get("repo")
        if not isinstance(repo, str) or not repo:
            raise TaskRefused("missing_repo", "the task names no repo")
        urls = self.settings.sandbox_urls
        # Spread episodes over the services by a stable hash; the next one on a failure.
        start = zlib.crc32(episode_id.encode()) % len(urls)
        failures = []
        for url in [urls[(start + offset) % len(urls)] for offset in range(len(urls))]:
            try:
                reply = await self.post(url, SESSIONS_PATH, {"repo": repo})
            except ToolServiceUnavailable as error:
                failures.append(str(error))
                continue
            return SWESession(self, url, str(reply["session_id"]))
        raise ToolServiceUnavailable("; ".join(failures))

    async def post(self, url: str, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """The service's JSON answer; ToolArgumentError for arguments it refused, TaskRefused
        for a repository it does not have, ToolServiceUnavailable for everything else."""
        timeout = httpx.Timeout(self.settings.task_timeout, connect=_CONNECT_TIMEOUT_S)
        try:
            response = await self._http().post(
                url.rstrip("/") + path, json=dict(body), headers=self.headers, timeout=timeout
            )
        except httpx.HTTPError as error:
            raise ToolServiceUnavailable(f"{url}: {type(error).__name__}") from error
        try:
            reply = response.json()
        except ValueError:
            reply = {}
        if not isinstance(reply, dict):
            reply = {}
        if response.status_code == 200:
            return reply
        said = str(reply.get("error", response.reason_phrase))
        if response.status_code == 400 and reply.get("kind") == BAD_ARGUMENTS:
            raise ToolArgumentError(said)
        if response.status_code == 413 and reply.get("kind") == SUBMISSION_TOO_LARGE:
            raise ToolArgumentError(said)  # a failed submission: it scores 0
        if response.status_code == 422:
            raise TaskRefused("unknown_repo", said)
        raise ToolServiceUnavailable(f"{url}{path}: HTTP {response.status_code}: {said}")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
