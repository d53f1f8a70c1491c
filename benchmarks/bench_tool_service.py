"""Per-call overhead of tools as a service: a calculator call in-process vs over NATS ``micro``.

Both go through ``run_tool_call`` (the episode's boundary: timeout, size and UTF-8 checks), one
call at a time as an episode makes them, against a local nats-server (this machine's loopback:
no network latency; another datacenter adds its round trip). The ratio is measured in the same
run; each figure is the median of ``--repeats`` rounds of ``--calls`` calls.

    PYTHONPATH=. python benchmarks/bench_tool_service.py [--calls N] [--repeats R] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import nats
from report import replace_section

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings
from dockyard.environments.tools.calculator import CalculatorToolbox
from dockyard.environments.tools.calls import ParsedCall
from dockyard.environments.tools.service import RemoteToolbox, ToolService
from dockyard.environments.tools.toolbox import ToolLimits, ToolSession, run_tool_call

CALL = ParsedCall("calculator", '{"expression": "37*48"}', {"expression": "37*48"})


async def per_call_us(session: ToolSession, calls: int) -> float:
    limits = ToolLimits()
    started = time.perf_counter()
    for _ in range(calls):
        outcome = await run_tool_call(session, CALL, limits)
        assert outcome.text == "1776", outcome
    return (time.perf_counter() - started) / calls * 1e6


async def measure(calls: int, repeats: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as store:
        server = EmbeddedNatsServer(EmbeddedServerSettings(store_dir=Path(store)))
        url = server.start()
        try:
            served, client = await nats.connect(url), await nats.connect(url)
            service = await ToolService(served, CalculatorToolbox()).start()
            remote = RemoteToolbox(client, "calculator")
            local = await CalculatorToolbox().open_session("local")
            inproc, over_nats, opens = [], [], []
            for round_ in range(repeats):
                inproc.append(await per_call_us(local, calls))
                started = time.perf_counter()
                session = await remote.open_session(f"bench:{round_}")
                opens.append((time.perf_counter() - started) * 1e6)
                over_nats.append(await per_call_us(session, calls))
                await session.aclose()
            await service.stop()
            await served.close()
            await client.close()
        finally:
            server.kill()
    return statistics.median(inproc), statistics.median(over_nats), statistics.median(opens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    inproc, remote, opened = asyncio.run(measure(args.calls, args.repeats))
    lines = [
        "## Tools as a service (per-call overhead)",
        "",
        f"Measured {date.today().isoformat()} on this machine (2 shared CPU cores, local "
        f"nats-server), `PYTHONPATH=. python benchmarks/bench_tool_service.py --calls "
        f"{args.calls} --repeats {args.repeats}`: one calculator call at a time through "
        "`run_tool_call`, median of the rounds.",
        "",
        "| path | µs per call |",
        "| --- | --- |",
        f"| in-process session | {inproc:.0f} |",
        f"| NATS micro request-reply (`RemoteToolbox` → `ToolService`) | {remote:.0f} |",
        f"| opening a remote session (once per episode) | {opened:.0f} |",
        "",
        f"Overhead of the service: {remote - inproc:.0f} µs per call ({remote / inproc:.0f}× the "
        "in-process call, which does almost nothing); against a decode turn of a real model "
        "(tens of milliseconds and up) it is small, and a sandboxed tool (a process, a "
        "container) costs milliseconds itself.",
    ]
    print("\n".join(lines))
    if args.write_docs:
        replace_section("tool-service", lines)


if __name__ == "__main__":
    main()
