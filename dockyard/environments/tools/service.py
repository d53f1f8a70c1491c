"""Tools as a service: a toolbox served over NATS request-reply with nats-py's ``micro``.

Tools and sandboxes run in processes of their own, scaled apart from generation; a rollout worker
reaches them through :class:`RemoteToolbox`, a :class:`Toolbox` like any other. ``micro`` gives
discovery and statistics for free (``nats micro ls``, ``$SRV.INFO``, ``$SRV.STATS``).

Subjects, for a toolbox ``T`` under ``prefix`` (default ``dockyard.tools``):

- ``{prefix}.T.open`` — in a queue group: any instance opens the episode's session and answers
  ``{"instance": ID, "tools": [...]}``; the session lives in that instance.
- ``{prefix}.T.{ID}.call`` / ``.close`` — that instance only: the episode's calls reach its
  session wherever it lives. Request: JSON ``{"episode_id", "name", "arguments"}``; reply: the
  tool's output bytes as they are (the client checks UTF-8 and size like any tool's output).

Errors travel as micro error replies: ``400`` the tool refused its arguments
(``ToolArgumentError``), ``404`` no such session (the instance restarted: its sandboxes are gone),
``422`` the task cannot be set up (:class:`TaskRefused`: reason and detail as a JSON pair),
``500`` the tool raised. On the client, no responder, a closed connection, a request past
``request_timeout_s`` or a ``404`` are :class:`ToolServiceUnavailable`: the episode fails and
its group is replayed from scratch (docs/multiturn.md).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.micro import add_service
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER, Request
from nats.micro.service import Service

from dockyard.environments.tools.toolbox import (
    NO_TASK,
    TaskRefused,
    ToolArgumentError,
    Toolbox,
    ToolOutput,
    ToolServiceUnavailable,
    ToolSession,
)
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

SERVICE_NAME = "dockyard-tools"
SERVICE_VERSION = "1.0.0"
DEFAULT_PREFIX = "dockyard.tools"


class ToolService:
    """Serves one toolbox; its sessions (the episodes' sandboxes) live in this process."""

    def __init__(self, nc: Client, toolbox: Toolbox, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.nc = nc
        self.toolbox = toolbox
        self.prefix = f"{prefix}.{toolbox.name}"
        self.sessions: dict[str, ToolSession] = {}
        self.service: Service | None = None

    async def start(self) -> ToolService:
        service = await add_service(
            self.nc,
            name=SERVICE_NAME,
            version=SERVICE_VERSION,
            metadata={"toolbox": self.toolbox.name},
        )
        await service.add_endpoint(name="open", subject=f"{self.prefix}.open", handler=self.open)
        own = f"{self.prefix}.{service.id}"
        # Not in the queue group: a session's calls must reach the instance that holds it.
        await service.add_endpoint(
            name="call", subject=f"{own}.call", handler=self.call, queue_group=service.id
        )
        await service.add_endpoint(
            name="close", subject=f"{own}.close", handler=self.close, queue_group=service.id
        )
        self.service = service
        # Started means reachable: the server has the subscriptions before this returns.
        await self.nc.flush()
        return self

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()
        sessions, self.sessions = self.sessions, {}
        for session in sessions.values():
            await session.aclose()

    async def open(self, request: Request) -> None:
        body = json.loads(request.data)
        episode_id = body["episode_id"]
        try:
            session = await self.toolbox.open_session(episode_id, body.get("task", {}))
        except TaskRefused as error:
            await request.respond_error("422", json.dumps([error.reason, str(error)]))
            return
        self.sessions[episode_id] = session
        assert self.service is not None
        reply = {"instance": self.service.id, "tools": sorted(session.tool_names)}
        await request.respond(json.dumps(reply).encode())

    async def call(self, request: Request) -> None:
        body = json.loads(request.data)
        session = self.sessions.get(body["episode_id"])
        if session is None:
            await request.respond_error("404", f"no session {body['episode_id']!r} here")
            return
        try:
            output = await session.call(body["name"], body["arguments"])
        except ToolArgumentError as error:
            await request.respond_error("400", str(error))
            return
        except Exception as error:  # the tool's failure is the caller's observation
            await request.respond_error("500", f"{type(error).__name__}: {error}")
            return
        if isinstance(output, ToolOutput):
            if output.images:
                # The service's reply is the tool's text: an image would be dropped on the way.
                await request.respond_error(
                    "500", f"{body['name']} answered with images, which a tool service cannot carry"
                )
                return
            output = output.text
        await request.respond(
            output.encode("utf-8", "surrogatepass") if isinstance(output, str) else output
        )

    async def close(self, request: Request) -> None:
        session = self.sessions.pop(json.loads(request.data)["episode_id"], None)
        if session is not None:
            await session.aclose()
        await request.respond(b"")


class RemoteSession(ToolSession):
    def __init__(
        self, toolbox: RemoteToolbox, episode_id: str, instance: str, tools: list[str]
    ) -> None:
        self.toolbox = toolbox
        self.episode_id = episode_id
        self.subject = f"{toolbox.prefix}.{instance}"
        self._tools = frozenset(tools)

    @property
    def tool_names(self) -> frozenset[str]:
        return self._tools

    async def call(self, name: str, arguments: Mapping[str, Any]) -> bytes:
        body = {"episode_id": self.episode_id, "name": name, "arguments": dict(arguments)}
        return await self.toolbox.request(f"{self.subject}.call", body)

    async def aclose(self) -> None:
        # An instance that is gone took its sandboxes with it: nothing is left to close.
        with contextlib.suppress(ToolServiceUnavailable):
            await self.toolbox.request(f"{self.subject}.close", {"episode_id": self.episode_id})


class RemoteToolbox(Toolbox):
    """The client of a :class:`ToolService`; ``name`` is the served toolbox's."""

    def __init__(
        self,
        nc: Client,
        name: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        request_timeout_s: float = 60.0,
    ) -> None:
        self.nc = nc
        self.name = name  # type: ignore[misc]  # per instance: one class serves every toolbox
        self.prefix = f"{prefix}.{name}"
        # Above ToolLimits.timeout_s: a slow tool is the model's timeout observation, not a
        # lost service.
        self.request_timeout_s = request_timeout_s

    async def open_session(self, episode_id: str, task: Mapping[str, Any] = NO_TASK) -> ToolSession:
        body = {"episode_id": episode_id, "task": dict(task)}
        reply = json.loads(await self.request(f"{self.prefix}.open", body))
        return RemoteSession(self, episode_id, reply["instance"], reply["tools"])

    async def request(self, subject: str, body: Mapping[str, Any]) -> bytes:
        try:
            message = await self.nc.request(
                subject, json.dumps(body).encode(), timeout=self.request_timeout_s
            )
        except (NoRespondersError, ConnectionClosedError, NatsTimeoutError) as error:
            raise ToolServiceUnavailable(f"{subject}: {type(error).__name__}") from error
        code = (message.headers or {}).get(ERROR_CODE_HEADER)
        if code is None:
            return message.data
        description = (message.headers or {}).get(ERROR_HEADER, "")
        if code == "400":
            raise ToolArgumentError(description)
        if code == "404":
            raise ToolServiceUnavailable(description)
        if code == "422":
            reason, detail = json.loads(description)
            raise TaskRefused(reason, detail)
        raise RuntimeError(description)
