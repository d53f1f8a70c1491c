"""A userspace WAN link between two sites on this machine: a TCP proxy with latency and a switch.

This kernel has no ``netem`` (``../shared/notes/multi-site.md``), so the link's one-way delay and
its partitions are made here, in asyncio: every chunk read on one side is written to the other
``delay_s`` later (order kept per direction), and :meth:`WanLink.cut` closes every connection
and refuses new ones until :meth:`WanLink.heal` — what a leaf node sees when a WAN link drops.
Bytes carried each way are counted, so a test can say what crossed the link.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class LinkCounters:
    to_upstream: int = 0  # bytes from the connecting side (a leaf) to the listening side (a hub)
    to_downstream: int = 0
    connections: int = 0


class SiteLink(Protocol):
    """What a two-site test needs of its WAN link: this proxy, or the kernel link of
    ``tests/netns_link.py`` (network namespaces, a ``tc tbf``-capped veth)."""

    @property
    def counters(self) -> LinkCounters: ...

    def cut(self) -> None: ...

    def heal(self) -> None: ...


@dataclass
class WanLink:
    """Listens on ``127.0.0.1:<port>`` and forwards to ``upstream_host:upstream_port``."""

    upstream_host: str
    upstream_port: int
    delay_s: float = 0.0
    #: Bandwidth cap per direction, shared by all connections (None: loopback speed). Each
    #: chunk occupies the link for len/rate seconds after the one before it, then propagates.
    rate_bytes_per_s: float | None = None
    counters: LinkCounters = field(default_factory=LinkCounters)
    _link_free_at: dict[bool, float] = field(default_factory=dict)
    _server: asyncio.Server | None = None
    _up: bool = True
    _pumps: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _connected: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def wait_connected(self) -> None:
        """Until a connection was made through the link since it was last (re)started/healed."""
        await self._connected.wait()

    def cut(self) -> None:
        """Partition: drop every connection now and refuse new ones until :meth:`heal`."""
        self._up = False
        self._connected.clear()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def heal(self) -> None:
        self._up = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            writer.transport.abort()
            return
        self.counters.connections += 1
        self._writers.update((writer, up_writer))
        self._connected.set()
        for source, sink, upstream in ((reader, up_writer, True), (up_reader, writer, False)):
            task = asyncio.create_task(self._pump(source, sink, upstream=upstream))
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    def _arrival(self, now: float, nbytes: int, upstream: bool) -> float:
        """When a chunk read now reaches the far side: serialised at the capped rate behind
        what is already on the wire in that direction, then delayed by the propagation."""
        if self.rate_bytes_per_s is None:
            return now + self.delay_s
        sent = max(now, self._link_free_at.get(upstream, 0.0)) + nbytes / self.rate_bytes_per_s
        self._link_free_at[upstream] = sent
        return sent + self.delay_s

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        # A delay line: chunks are stamped when read and written once their time has come, so
        # latency does not cap throughput (a window's worth of bytes can be in flight).
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)  # the emulated propagation delay, not a sync
                sink.write(chunk)
                await sink.drain()
                if upstream:
                    self.counters.to_upstream += len(chunk)
                else:
                    self.counters.to_downstream += len(chunk)

        writer_task = asyncio.create_task(deliver())
        try:
            while True:
                chunk = await source.read(65536)
                queue.put_nowait((self._arrival(loop.time(), len(chunk), upstream), chunk))
                if not chunk:
                    break
            await writer_task
        except (ConnectionError, OSError):
            pass
        finally:
            writer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await writer_task
            self._writers.discard(sink)
            sink.transport.abort()


class WanLinkThread:
    """A :class:`WanLink` served from its own event loop in a thread, for synchronous tests
    that drive subprocesses (``cut``/``heal`` are handed to that loop and waited for)."""

    def __init__(self, upstream_host: str, upstream_port: int, *, delay_s: float = 0.0) -> None:
        import threading

        self.link = WanLink(upstream_host, upstream_port, delay_s=delay_s)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan-link", daemon=True)
        self._thread.start()
        self.port = self._call(self.link.start())

    def _call(self, coroutine: Coroutine[Any, Any, int]) -> int:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=30)

    async def _run(self, action: str) -> int:
        getattr(self.link, action)()
        return 0

    def cut(self) -> None:
        self._call(self._run("cut"))

    def heal(self) -> None:
        self._call(self._run("heal"))

    def wait_connected(self, timeout_s: float = 30.0) -> None:
        async def connected() -> int:
            async with asyncio.timeout(timeout_s):
                await self.link.wait_connected()
            return 0

        self._call(connected())

    def close(self) -> None:
        self._call(self._run_close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _run_close(self) -> int:
        await self.link.close()
        return 0
