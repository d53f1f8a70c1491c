"""The desktop simulator service: a STAND-IN for OSWorld's VMs, over HTTP.

``dockyard osworld serve`` runs this Starlette app. It hosts many simulated desktops
(:mod:`.desktop`), one per episode, each under its own prefix ``/desktops/{id}``, and at that
prefix it answers the part of the REAL in-VM server's API (OSWorld ``desktop_env/server/main.py``,
called by ``desktop_env/controllers/python.py``) that a desktop of widgets can implement:

- ``GET  /screenshot`` — the screen as PNG bytes;
- ``GET  /accessibility`` — ``{"AT": "<xml>"}``;
- ``POST /execute`` — ``{"command": ["python", "-c", "<code>"], "shell": false}`` →
  ``{"status", "output", "error", "returncode"}``; the code is *parsed* with the action space's
  reader (:mod:`.actions`), never run: other programs, shell commands and any Python beyond the
  whitelisted pyautogui calls get ``returncode`` 1 and the reason;
- ``POST /screen_size`` — ``{"width", "height"}``; ``GET /platform`` — ``Linux``.

A client pointed at ``http://vm:5000`` (a real VM) or at ``http://sim/desktops/{id}`` (here)
speaks the same requests. What only the simulator has: ``POST /desktops`` (body: a task's
``config``) creates a desktop and answers its id, ``DELETE /desktops/{id}`` discards it.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dockyard.environments.osworld.actions import ActionParseError, Special, parse_actions
from dockyard.environments.osworld.desktop import Desktop
from dockyard.environments.osworld.tasks import SetupStep, TaskError, parse_setup
from dockyard.utils.logging import get_logger

log = get_logger(__name__)

#: Interpreters whose ``-c`` code the simulator reads as pyautogui actions (what OSWorld's
#: controller sends); any other program is refused.
PYTHONS = ("python", "python3")
MAX_BODY_BYTES = 256 * 1024


class DesktopPool:
    """The live desktops by id, bounded: a full pool refuses new ones (503), never evicts."""

    def __init__(self, max_desktops: int) -> None:
        self.max_desktops = max_desktops
        self.desktops: dict[str, Desktop] = {}

    def create(self, setup: SetupStep) -> str:
        if len(self.desktops) >= self.max_desktops:
            raise OverflowError(f"{self.max_desktops} desktops are open; close one first")
        desktop_id = secrets.token_hex(8)
        self.desktops[desktop_id] = Desktop.from_spec(setup.parameters)
        return desktop_id


def execute(desktop: Desktop, body: object) -> dict[str, Any]:
    """``/execute``: the controller's python command, read as actions and applied in order.

    All or nothing: if any statement is refused, none is applied (a real interpreter would
    have run the lines before the error; the simulator refuses the whole program because it
    never runs code, it only recognises it)."""
    if not isinstance(body, dict):
        return _failed("the body must be a JSON object with 'command'")
    command, shell = body.get("command"), body.get("shell", False)
    if shell or isinstance(command, str):
        return _failed("the simulator runs no shell commands, only pyautogui code")
    if (
        not isinstance(command, list)
        or len(command) != 3
        or command[0] not in PYTHONS
        or command[1] != "-c"
        or not isinstance(command[2], str)
    ):
        return _failed('command must be ["python", "-c", "<pyautogui code>"]')
    try:
        actions = parse_actions(command[2])
    except ActionParseError as error:
        return _failed(str(error))
    if any(isinstance(action, Special) for action in actions):
        return _failed("WAIT/DONE/FAIL are the agent's answers, not code for the controller")
    for action in actions:
        desktop.apply(action)
    return {"status": "success", "output": "", "error": "", "returncode": 0}


def _failed(reason: str) -> dict[str, Any]:
    return {"status": "error", "output": "", "error": reason, "returncode": 1}


def create_app(max_desktops: int = 256) -> Starlette:
    pool = DesktopPool(max_desktops)

    def desktop_of(request: Request) -> Desktop | None:
        return pool.desktops.get(request.path_params["desktop_id"])

    async def json_body(request: Request) -> object:
        # Read in chunks and stop past the cap: a huge body is refused before it is held.
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise ValueError(f"the body is over {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            return json.loads(raw) if raw else {}
        except RecursionError:  # nesting past the parser's depth: refused, not a 500
            raise ValueError("the body is nested too deeply") from None

    async def create(request: Request) -> Response:
        try:
            body = await json_body(request)
            setup = parse_setup(body.get("config") if isinstance(body, dict) else None)
        except (ValueError, TaskError) as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        try:
            desktop_id = pool.create(setup)
        except OverflowError as error:
            return JSONResponse({"error": str(error)}, status_code=503)
        return JSONResponse({"id": desktop_id}, status_code=201)

    async def delete(request: Request) -> Response:
        if pool.desktops.pop(request.path_params["desktop_id"], None) is None:
            return JSONResponse({"error": "no such desktop"}, status_code=404)
        return Response(status_code=204)

    async def screenshot(request: Request) -> Response:
        desktop = desktop_of(request)
        if desktop is None:
            return JSONResponse({"error": "no such desktop"}, status_code=404)
        return Response(desktop.screenshot(), media_type="image/png")

    async def accessibility(request: Request) -> Response:
        desktop = desktop_of(request)
        if desktop is None:
            return JSONResponse({"error": "no such desktop"}, status_code=404)
        return JSONResponse({"AT": desktop.accessibility_tree()})

    async def run(request: Request) -> Response:
        desktop = desktop_of(request)
        if desktop is None:
            return JSONResponse({"error": "no such desktop"}, status_code=404)
        try:
            body = await json_body(request)
        except ValueError as error:
            return JSONResponse(_failed(f"bad request body: {error}"), status_code=400)
        return JSONResponse(execute(desktop, body))

    async def screen_size(request: Request) -> Response:
        desktop = desktop_of(request)
        if desktop is None:
            return JSONResponse({"error": "no such desktop"}, status_code=404)
        return JSONResponse({"width": desktop.width, "height": desktop.height})

    async def platform(request: Request) -> Response:
        return PlainTextResponse("Linux")

    prefix = "/desktops/{desktop_id}"
    return Starlette(
        routes=[
            Route("/desktops", create, methods=["POST"]),
            Route(prefix, delete, methods=["DELETE"]),
            Route(f"{prefix}/screenshot", screenshot, methods=["GET"]),
            Route(f"{prefix}/accessibility", accessibility, methods=["GET"]),
            Route(f"{prefix}/execute", run, methods=["POST"]),
            Route(f"{prefix}/screen_size", screen_size, methods=["POST"]),
            Route(f"{prefix}/platform", platform, methods=["GET"]),
        ]
    )
