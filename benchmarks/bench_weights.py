"""Weight-blob transfer: dockyard's JetStream chunk reader vs nats-py ObjectStore.get vs TCP.

All three move the same random bytes over loopback from the same embedded nats-server (the TCP
copy needs no server: it is the physical limit of this machine). Reads are timed; puts are
reported for information. Targets: dockyard ≥ 5× ``ObjectStore.get``.

    python benchmarks/bench_weights.py [--sizes-mib 64 1024] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.weight_blobs.jetstream_blobs import JetStreamBlobStore
from dockyard.config.sections.data_plane import DataPlaneConfig

MiB = 1024 * 1024
DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


async def tcp_copy(data: bytes) -> float:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=16 * MiB)
    buffer = bytearray(len(data))
    offset = 0
    while offset < len(data):
        block = await reader.read(8 * MiB)
        if not block:
            break
        buffer[offset : offset + len(block)] = block
        offset += len(block)
    elapsed = time.perf_counter() - started
    writer.close()
    server.close()
    assert offset == len(data)
    return elapsed


BASELINE_TIMEOUT_S = 240.0


async def object_store(url: str, data: bytes, name: str) -> tuple[float, float | None]:
    """nats-py's own object store; ``get`` is bounded: on large blobs its iterator subscription
    hits slow-consumer errors (messages dropped) and may never finish (seen at 1 GiB)."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=600)
    store = await js.create_object_store(name)
    started = time.perf_counter()
    await store.put("blob", data)
    put_s = time.perf_counter() - started
    started = time.perf_counter()
    get_s: float | None
    try:
        result = await asyncio.wait_for(store.get("blob"), BASELINE_TIMEOUT_S)
        get_s = time.perf_counter() - started
        assert result.data == data
    except TimeoutError:
        get_s = None
    await js.delete_object_store(name)
    await nc.close()
    return put_s, get_s


async def dockyard(url: str, data: bytes, namespace: str) -> tuple[float, float]:
    config = DataPlaneConfig(
        url=url, namespace=namespace, streams={"max_bytes": -1}, publish={"timeout_s": 120}
    )
    async with JetStreamPlane(config) as plane:
        store = JetStreamBlobStore(
            plane, keep_last=2, grace_s=0, chunk_size=4 * MiB, stall_timeout_s=60
        )
        started = time.perf_counter()
        ref = await store.put(1, data)
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        assert await store.get_bytes(ref) == data  # digest verified inside
        get_s = time.perf_counter() - started
        await plane.js.delete_stream(plane.names.blobs_stream.name)
    return put_s, get_s


Row = tuple[int, float, float | None, float, float, float]


async def run(sizes_mib: list[int]) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as store:
        server = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=Path(store), max_payload=8 * MiB, max_pending=128 * MiB
            )
        )
        url = server.start()
        try:
            for size in sizes_mib:
                data = os.urandom(size * MiB)
                tcp_s = await tcp_copy(data)
                ours_put, ours_get = await dockyard(url, data, f"w{size}")
                os_put, os_get = await object_store(url, data, f"os{size}")
                objects = size / os_get if os_get else None
                rows.append((size, size / ours_get, objects, size / tcp_s, ours_put, os_put))
                print(rows[-1], file=sys.stderr)
        finally:
            server.stop()
    return rows


def table(rows: list[Row]) -> list[str]:
    lines = [
        "| blob | dockyard get MiB/s | ObjectStore.get MiB/s | vs ObjectStore | "
        "loopback TCP MiB/s | of TCP | put s (dockyard / ObjectStore) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, ours, objects, tcp, ours_put, os_put in rows:
        if objects is None:
            baseline = f"did not finish in {BASELINE_TIMEOUT_S:.0f} s (slow-consumer drops)"
            ratio = f"> {ours * BASELINE_TIMEOUT_S / size:.0f}×"
        else:
            baseline, ratio = f"{objects:.0f}", f"{ours / objects:.1f}×"
        lines.append(
            f"| {size} MiB | {ours:.0f} | {baseline} | **{ratio}** | "
            f"{tcp:.0f} | {ours / tcp:.0%} | {ours_put:.1f} / {os_put:.1f} |"
        )
    return lines


def write_docs(lines: list[str]) -> None:
    body = [
        f"`python benchmarks/bench_weights.py --write-docs` ({date.today()}): JetStream chunk "
        "transport read chunk by chunk with direct gets (SHA-256 verified while reading) "
        "vs nats-py `ObjectStore.get` vs a plain asyncio loopback TCP copy, same "
        "bytes, same server. Target: ≥ 5× `ObjectStore.get`.",
        "",
        *lines,
    ]
    replace_section("data-plane", body, subsection="### Weight blobs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    lines = table(asyncio.run(run(args.sizes_mib)))
    print("\n".join(lines))
    if args.write_docs:
        write_docs(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
