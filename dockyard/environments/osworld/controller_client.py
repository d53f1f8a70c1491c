"""An asynchronous client of OSWorld's VM controller API (httpx).

:class:`DesktopController` speaks the requests of OSWorld's ``PythonController``
(``desktop_env/controllers/python.py``) to one desktop's base URL — a real VM's in-VM server
(``http://<vm>:5000``) or one simulated desktop (``http://<simulator>/desktops/<id>``):
``GET /screenshot``, ``GET /accessibility``, ``POST /execute`` (pyautogui code wrapped in
``python -c`` behind the same prefix OSWorld sends), ``POST /screen_size``.
:class:`SimulatorClient` opens and discards simulated desktops (the stand-in's own endpoints).

Everything the controller answers is checked before use: a screenshot must be a PNG, the tree
must be a string, an execute reply must say how it ended. A controller that cannot be reached
or answers nonsense raises :class:`ControllerUnavailable` (not the model's fault).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from dockyard.environments.osworld.tasks import DesktopTask

#: What OSWorld's controller puts before an agent's code (``PythonController.pkgs_prefix``).
PKGS_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_SCREENSHOT_BYTES = 32 * 1024 * 1024


class ControllerUnavailable(RuntimeError):
    """The controller did not answer, or answered outside its API."""


@dataclass(frozen=True)
class ExecuteResult:
    ok: bool
    output: str
    error: str
    returncode: int


class DesktopController:
    def __init__(self, client: httpx.AsyncClient, base_url: str) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.client.request(method, self.base_url + path, **kwargs)
        except httpx.HTTPError as error:
            raise ControllerUnavailable(f"{method} {path}: {error!r}") from None
        if response.status_code != 200:
            raise ControllerUnavailable(
                f"{method} {path}: HTTP {response.status_code}: {response.text[:200]}"
            )
        return response

    async def screenshot(self) -> bytes:
        response = await self._request("GET", "/screenshot")
        data = response.content
        if not data.startswith(PNG_MAGIC) or len(data) > MAX_SCREENSHOT_BYTES:
            raise ControllerUnavailable("/screenshot did not answer a PNG (of bounded size)")
        return data

    async def accessibility_tree(self) -> str:
        reply = (await self._request("GET", "/accessibility")).json()
        tree = reply.get("AT") if isinstance(reply, dict) else None
        if not isinstance(tree, str):
            raise ControllerUnavailable("/accessibility did not answer {'AT': <xml>}")
        return tree

    async def execute_python(self, code: str) -> ExecuteResult:
        body = {"command": ["python", "-c", PKGS_PREFIX + code], "shell": False}
        reply = (await self._request("POST", "/execute", json=body)).json()
        if not isinstance(reply, dict) or not isinstance(reply.get("returncode"), int):
            raise ControllerUnavailable("/execute did not answer a returncode")
        return ExecuteResult(
            ok=reply.get("status") == "success" and reply["returncode"] == 0,
            output=str(reply.get("output") or ""),
            error=str(reply.get("error") or ""),
            returncode=reply["returncode"],
        )

    async def screen_size(self) -> tuple[int, int]:
        reply = (await self._request("POST", "/screen_size")).json()
        if not isinstance(reply, dict):
            raise ControllerUnavailable("/screen_size did not answer {width, height}")
        width, height = reply.get("width"), reply.get("height")
        if not isinstance(width, int) or not isinstance(height, int):
            raise ControllerUnavailable("/screen_size did not answer {width, height}")
        return width, height


class SimulatorClient:
    """Desktops of the simulator service (``env.osworld.simulator_url``), one per episode."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.AsyncClient(timeout=timeout_s)

    async def open_desktop(self, task: DesktopTask) -> tuple[str, DesktopController]:
        config = [step.model_dump(mode="json", exclude_none=True) for step in task.config]
        try:
            response = await self.client.post(f"{self.url}/desktops", json={"config": config})
        except httpx.HTTPError as error:
            raise ControllerUnavailable(f"POST /desktops: {error!r}") from None
        reply = response.json() if response.status_code == 201 else None
        if not isinstance(reply, dict) or not isinstance(reply.get("id"), str):
            raise ControllerUnavailable(
                f"POST /desktops: HTTP {response.status_code}: {response.text[:200]}"
            )
        desktop_id = reply["id"]
        return desktop_id, DesktopController(self.client, f"{self.url}/desktops/{desktop_id}")

    async def close_desktop(self, desktop_id: str) -> None:
        try:
            await self.client.delete(f"{self.url}/desktops/{desktop_id}")
        except httpx.HTTPError as error:
            raise ControllerUnavailable(f"DELETE /desktops/{desktop_id}: {error!r}") from None

    async def aclose(self) -> None:
        await self.client.aclose()
