"""Shared plumbing of the engines that talk to inference servers over HTTP (vLLM, SGLang)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence

import httpx

from dockyard.engines.base import EngineError


class ServerPool:
    """Round-robin over one or more server base URLs with one pooled async client."""

    def __init__(self, server_urls: Sequence[str], *, timeout_s: float, backend: str) -> None:
        if not server_urls:
            raise EngineError(f"the {backend} backend needs at least one server URL")
        self.urls = [url.rstrip("/") for url in server_urls]
        self._backend = backend
        self._next = itertools.cycle(range(len(self.urls)))
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))

    def pick(self) -> str:
        return self.urls[next(self._next)]

    async def post(self, url: str, path: str, **kwargs: object) -> httpx.Response:
        return await self._request("POST", url, path, **kwargs)

    async def get(self, url: str, path: str, **kwargs: object) -> httpx.Response:
        return await self._request("GET", url, path, **kwargs)

    async def _request(self, method: str, url: str, path: str, **kwargs: object) -> httpx.Response:
        try:
            response = await self._client.request(method, f"{url}{path}", **kwargs)  # type: ignore[arg-type]  # kwargs: httpx request options, passed through
        except httpx.HTTPError as error:
            raise EngineError(f"{self._backend} server {url}{path}: {error!r}") from error
        if response.status_code >= 400:
            raise EngineError(
                f"{self._backend} server {url}{path} answered {response.status_code}: "
                f"{response.text[:500]}"
            )
        return response

    async def alive(self, url: str, path: str = "/health") -> bool:
        try:
            response = await self._client.get(f"{url}{path}", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        await self._client.aclose()


class AsyncRefitGate:
    """Client-side ``finish_on_old`` for server engines: a refit waits until the requests this
    engine has in flight are done and holds new ones back until the new version is live, so
    the version recorded when a request is sent is the version that serves all of it."""

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._in_flight = 0
        self._refitting = False

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        async with self._condition:
            await self._condition.wait_for(lambda: not self._refitting)
            self._in_flight += 1
        try:
            yield
        finally:
            async with self._condition:
                self._in_flight -= 1
                self._condition.notify_all()

    @contextlib.asynccontextmanager
    async def refit(self) -> AsyncIterator[None]:
        async with self._condition:
            await self._condition.wait_for(lambda: not self._refitting)
            self._refitting = True
            await self._condition.wait_for(lambda: self._in_flight == 0)
        try:
            yield
        finally:
            async with self._condition:
                self._refitting = False
                self._condition.notify_all()
