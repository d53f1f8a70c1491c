"""What the engines served over HTTP (SGLang, vLLM's server) share: the server pool, the
client-side refit gate, staging of new weights, and the request fan-out.

A subclass says how one request becomes samples (``_generate_one``) and how one server loads
staged weights (``_refit_server``); this class runs them on every request and every server. A
subclass whose servers load more than weights directories (vLLM: LoRA adapters) replaces
``_refit_all``, which runs with requests held back.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from dockyard.engines.base import (
    EngineError,
    EngineHealth,
    GenerationEngine,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    WeightSource,
    check_request_shapes,
    refuse_images,
)
from dockyard.engines.http_client import AsyncRefitGate, ServerPool
from dockyard.engines.weight_loading import stage_weights_dir
from dockyard.utils.logging import get_logger

log = get_logger(__name__)


class HttpServerEngine(GenerationEngine):
    #: How this engine names itself in logs and errors (``backend`` names the config choice).
    label: str = "abstract"

    def __init__(
        self,
        server_urls: Sequence[str],
        *,
        request_timeout_s: float = 600.0,
        initial_version: int = 0,
        staging_dir: str | Path | None = None,
    ) -> None:
        self._pool = ServerPool(server_urls, timeout_s=request_timeout_s, backend=self.backend)
        self._version = initial_version
        self._gate = AsyncRefitGate()
        # Staged weights must be readable by the servers: same machine or a shared volume.
        base = Path(staging_dir or tempfile.gettempdir())
        self._staging_dir = base / f"dockyard-{self.backend}-refit"
        self._closed = False

    @property
    def current_version(self) -> int:
        return self._version

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams, num_samples: int
    ) -> list[GenerationResult]:
        self._check_open()
        check_request_shapes(requests, num_samples)
        refuse_images(requests, self.label)
        await self._before_generate()
        started = time.perf_counter()
        per_request = await asyncio.gather(
            *(
                self._generate_one(index, request, params, num_samples, started)
                for index, request in enumerate(requests)
            )
        )
        return [result for results in per_request for result in results]

    async def _before_generate(self) -> None:
        """Anything the requests need first (once per ``generate``)."""

    @abstractmethod
    async def _generate_one(
        self,
        index: int,
        request: GenerationRequest,
        params: SamplingParams,
        num_samples: int,
        started: float,
    ) -> list[GenerationResult]:
        """The ``num_samples`` results of request ``index``; send it inside
        ``self._gate.request()`` and stamp its tokens with the version current then."""

    async def update_weights(self, version: int, source: WeightSource) -> None:
        self._check_open()
        started = time.perf_counter()
        async with self._gate.refit():
            # Every server finishes (or fails) before the gate opens: requests must never reach
            # a server that is still loading weights.
            await self._refit_all(version, source)
            self._version = version
        log.info(
            "refit_done",
            backend=self.label,
            version=version,
            seconds=round(time.perf_counter() - started, 4),
        )

    async def _refit_all(self, version: int, source: WeightSource) -> None:
        """Make every server serve ``source`` as ``version`` (runs with the gate closed)."""
        path = await asyncio.to_thread(stage_weights_dir, source, self._staging_dir)
        await self._on_every_server(
            f"refit to version {version}", lambda url: self._refit_server(url, version, path)
        )

    async def _on_every_server(
        self, what: str, call: Callable[[str], Awaitable[object]]
    ) -> list[object]:
        """``call(url)`` on every server at once; their results, or one error naming each server
        that failed (after all of them finished)."""
        outcomes = await asyncio.gather(
            *(call(url) for url in self._pool.urls), return_exceptions=True
        )
        failed = [
            f"{url}: {outcome}"
            for url, outcome in zip(self._pool.urls, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        if failed:
            raise EngineError(
                f"{what} failed on {len(failed)} of {len(self._pool.urls)} {self.label} "
                f"servers: {'; '.join(failed)}"
            )
        return list(outcomes)

    @abstractmethod
    async def _refit_server(self, url: str, version: int, path: Path) -> None:
        """Make the server at ``url`` serve the weights staged at ``path`` as ``version``."""

    async def health(self) -> EngineHealth:
        alive = await asyncio.gather(*(self._pool.alive(url) for url in self._pool.urls))
        down = [url for url, ok in zip(self._pool.urls, alive, strict=True) if not ok]
        detail = f"unreachable: {', '.join(down)}" if down else ""
        return EngineHealth(not down and not self._closed, self.backend, self._version, detail)

    async def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"the {self.label} engine is shut down")
