"""A kernel WAN link between two sites on this machine: network namespaces, a veth, ``tc tbf``.

``tests/wan_proxy.py`` emulates the WAN in userspace; this helper puts each site in its own
network namespace instead, so the bytes between them cross a real kernel link whose bandwidth
``tc qdisc ... tbf`` caps on both ends (this kernel has no ``netem``, so no kernel delay:
``../shared/notes/multi-site.md``). A partition is ``ip link set <veth> down``.

Topology (``A`` and ``B`` are the namespaces; addresses are private and unique per instance)::

    root ns ──access veth── A ══ WAN veth (tbf-capped, can be cut) ══ B ──access veth── root ns

The WAN veth is the only path between A and B: each namespace has only its connected routes
(no default route), so cutting it partitions the sites even if the root namespace forwards.
The two access veths (uncapped) are how clients in the root namespace — the test process —
reach each site's client port, as a site's own processes reach their local server; a server
in a namespace binds its client port to :attr:`NetnsSites.a_access` / ``b_access``. This is
simpler than running every client through ``ip netns exec`` and keeps the tests in-process.

Everything created here is removed by :meth:`NetnsSites.close` (processes started with
:meth:`NetnsSites.popen` are killed first), also when setting up fails half-way.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import pytest

from dockyard.broker.embedded import EmbeddedNatsServer, EmbeddedServerSettings, find_nats_server
from dockyard.broker.sites import hub_leafnodes, leaf_remote
from tests.wan_proxy import LinkCounters

#: A pool of private /29s (one per instance: two /30 access subnets) in the root namespace.
_ACCESS_POOL = ipaddress.ip_network("10.248.0.0/15")
_BLOCKS = _ACCESS_POOL.num_addresses // 8
#: The WAN subnet lives inside the namespaces only, so every instance may use the same one.
WAN_A = "10.247.0.1"
WAN_B = "10.247.0.2"
#: Site A's leaf-node port, on its WAN address inside namespace A (nothing else listens there).
LEAF_PORT = 7422
_instances = count()


async def leaf_connected(hub: EmbeddedNatsServer, timeout_s: float = 60.0) -> None:
    """Until the hub's log says a leaf connected (the servers have no monitoring port)."""
    deadline = time.monotonic() + timeout_s
    while "Leafnode connection created" not in hub.log_tail:
        if time.monotonic() > deadline:
            raise AssertionError(f"no leaf connected within {timeout_s}s:\n{hub.log_tail}")
        await asyncio.sleep(0.05)  # polling the log, not a synchronisation point


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here (for a skip), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); this test runs as a normal user"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed: apt-get install iproute2"
    return None


def require_netns() -> None:
    """Skip the calling test, with the reason, where namespaces cannot be made."""
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(reason)


@dataclass(frozen=True)
class Qdisc:
    kind: str
    rate_bytes_per_s: int  # tbf's rate (tc reports bytes per second); 0 for other kinds


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


@dataclass
class NetnsSites:
    """Namespaces ``a`` and ``b`` joined by a veth capped at ``rate_mbit`` each way."""

    rate_mbit: float
    #: tbf's bucket and queue: a burst ≥ rate/HZ keeps the cap exact on a coarse timer, and
    #: ``latency`` bounds the queue (longer waits are dropped, as a WAN router would).
    burst: str = "64kb"
    latency_ms: int = 400
    tag: str = field(
        default_factory=lambda: f"{os.getpid() % 0xFFFFFF:06x}{next(_instances) % 256:02x}"
    )
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: What this instance made, so :meth:`close` removes exactly that (never a namespace of
    #: the same name that another instance owns).
    created_namespaces: list[str] = field(default_factory=list)
    created_root_devices: list[str] = field(default_factory=list)
    servers: list[EmbeddedNatsServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Names must be unique on the machine (other test runs share it); a veth name has at
        # most 15 characters.
        self.a, self.b = f"dy-{self.tag}-a", f"dy-{self.tag}-b"
        self.wan_a, self.wan_b = f"dy{self.tag}wa", f"dy{self.tag}wb"
        self.root_a, self.ns_a = f"dy{self.tag}ra", f"dy{self.tag}na"
        self.root_b, self.ns_b = f"dy{self.tag}rb", f"dy{self.tag}nb"
        block = int(self.tag, 16) % _BLOCKS
        base = _ACCESS_POOL.network_address + block * 8
        self.root_a_ip, self.a_access = str(base + 1), str(base + 2)
        self.root_b_ip, self.b_access = str(base + 5), str(base + 6)

    def open(self) -> NetnsSites:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        for ns in (self.a, self.b):
            _ip("netns", "add", ns)
            self.created_namespaces.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.wan_a, "netns", self.a, "type", "veth", "peer", "name", self.wan_b)
        _ip("link", "set", self.wan_b, "netns", self.b)
        for ns, dev, address in ((self.a, self.wan_a, WAN_A), (self.b, self.wan_b, WAN_B)):
            _ip("-n", ns, "addr", "add", f"{address}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            # Each end shapes what it sends: the cap holds in both directions.
            shape = ["rate", f"{self.rate_mbit:g}mbit", "burst", self.burst]
            shape += ["latency", f"{self.latency_ms}ms"]
            _ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", *shape)
        for ns, root_dev, ns_dev, root_ip, ns_ip in (
            (self.a, self.root_a, self.ns_a, self.root_a_ip, self.a_access),
            (self.b, self.root_b, self.ns_b, self.root_b_ip, self.b_access),
        ):
            _ip("link", "add", root_dev, "type", "veth", "peer", "name", ns_dev)
            self.created_root_devices.append(root_dev)
            _ip("link", "set", ns_dev, "netns", ns)
            _ip("addr", "add", f"{root_ip}/30", "dev", root_dev)
            _ip("link", "set", root_dev, "up")
            _ip("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_dev)
            _ip("-n", ns, "link", "set", ns_dev, "up")

    def close(self) -> None:
        """Kill what was started in the namespaces, then remove them (their veths go too)."""
        for server in self.servers:
            server.kill()
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)
        for ns in self.created_namespaces:
            _ip("netns", "del", ns)
        self.created_namespaces.clear()
        for dev in self.created_root_devices:  # gone with their peers, unless a peer never moved
            subprocess.run(["ip", "link", "del", dev], capture_output=True, check=False)
        self.created_root_devices.clear()

    def __enter__(self) -> NetnsSites:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- running things in a namespace -----------------------------------------------------
    def popen(self, ns: str, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """``argv`` inside namespace ``ns``; killed by :meth:`close`."""
        process: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]  # kwargs pass through to Popen
            ["ip", "netns", "exec", ns, *argv], **kwargs
        )
        self.processes.append(process)
        return process

    def launcher(self, ns: str, binary: Path, directory: Path) -> Path:
        """An executable that runs ``binary`` with its arguments inside ``ns`` (``exec`` all the
        way, so its pid is the binary's: ``EmbeddedNatsServer(binary=...)`` kills the server)."""
        path = directory / f"in-{ns}-{binary.name}"
        path.write_text(f'#!/bin/sh\nexec ip netns exec {ns} {binary} "$@"\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    def start_site(self, site: str, store_dir: Path, leaf_namespace: str) -> EmbeddedNatsServer:
        """Site ``a`` (the hub: JetStream domain ``a``, leaf nodes accepted on its WAN address)
        or ``b`` (domain ``b``, a leaf of A across the WAN veth), a nats-server inside that
        site's namespace whose client port is on the site's access address; killed by
        :meth:`close`."""
        if site == "a":
            ns, host, leafnodes = self.a, self.a_access, hub_leafnodes(f"{WAN_A}:{LEAF_PORT}")
        elif site == "b":
            ns, host = self.b, self.b_access
            leafnodes = leaf_remote(f"nats://{WAN_A}:{LEAF_PORT}", leaf_namespace)
        else:
            raise ValueError(f"site must be 'a' or 'b', not {site!r}")
        server = EmbeddedNatsServer(
            EmbeddedServerSettings(
                store_dir=store_dir,
                host=host,
                jetstream_extra={"domain": site},
                extra={"server_name": f"site_{site}", "leafnodes": leafnodes},
            ),
            binary=self.launcher(ns, find_nats_server(), store_dir.parent),
        )
        self.servers.append(server)
        server.start()
        return server

    # -- the WAN link ----------------------------------------------------------------------
    def cut(self) -> None:
        """Partition: the WAN veth goes down (both ends lose carrier at once)."""
        _ip("-n", self.a, "link", "set", self.wan_a, "down")

    def heal(self) -> None:
        _ip("-n", self.a, "link", "set", self.wan_a, "up")

    def qdisc(self, ns: str, dev: str) -> Qdisc:
        """The root qdisc of one WAN end (to check the cap is in place)."""
        shown = subprocess.run(
            ["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show", "dev", dev],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        root = next(q for q in json.loads(shown) if q.get("root"))
        return Qdisc(str(root["kind"]), int(root.get("options", {}).get("rate", 0)))

    def _tx_bytes(self, ns: str, dev: str) -> int:
        shown = subprocess.run(
            ["ip", "-j", "-s", "-n", ns, "link", "show", "dev", dev],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(json.loads(shown)[0]["stats64"]["tx"]["bytes"])

    @property
    def counters(self) -> LinkCounters:
        """Bytes sent each way on the WAN veth so far (IP packets, headers included), in the
        shape of :class:`tests.wan_proxy.WanLink`'s counters: upstream is B (leaf) → A (hub)."""
        return LinkCounters(
            to_upstream=self._tx_bytes(self.b, self.wan_b),
            to_downstream=self._tx_bytes(self.a, self.wan_a),
        )
