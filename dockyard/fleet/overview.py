"""The fleet at a glance, read from the data plane alone (``dockyard status``, the dashboard):
each role instance's last heartbeat, every stream's size and its consumers' lag, and the dead
letters counted by the stage that refused them and the reason.

Nothing here needs the run directory or the machine a role runs on: whoever reaches the broker
(with credentials that may read the streams) sees the same view.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import msgspec
from rich.console import Group
from rich.table import Table

from dockyard.broker.heartbeats import BadHeartbeat, Heartbeat, is_silent, read_heartbeats
from dockyard.broker.inspect import Undecodable, decode_stored
from dockyard.broker.plane import DataPlane, StreamState
from dockyard.schemas import DeadLetter

#: A dead letter whose body does not decode has no stage to read: it is counted under this one.
UNKNOWN_STAGE = "?"


@dataclass(frozen=True)
class DeadLetterCount:
    stage: str
    reason: str
    count: int


@dataclass
class FleetOverview:
    namespace: str
    taken_at_unix_s: float
    heartbeats: list[Heartbeat | BadHeartbeat]
    streams: list[StreamState]
    dead_letters: list[DeadLetterCount] = field(default_factory=list)
    #: How many dead letters were counted, of how many the stream holds.
    dead_letters_counted: int = 0
    dead_letters_stored: int = 0
    notes: list[str] = field(default_factory=list)

    def silent(self, heartbeat: Heartbeat) -> bool:
        return is_silent(heartbeat, self.taken_at_unix_s)

    def to_json(self) -> dict[str, object]:
        roles: list[dict[str, object]] = []
        for record in self.heartbeats:
            if isinstance(record, BadHeartbeat):
                roles.append({"subject": record.subject, "error": record.reason})
                continue
            roles.append(
                {
                    **msgspec.to_builtins(record),
                    "age_s": self.taken_at_unix_s - record.sent_at_unix_s,
                    "silent": self.silent(record),
                }
            )
        return {
            "namespace": self.namespace,
            "taken_at_unix_s": self.taken_at_unix_s,
            "notes": self.notes,
            "roles": roles,
            "streams": [_stream_json(s) for s in self.streams],
            "dead_letters": {
                "stored": self.dead_letters_stored,
                "counted": self.dead_letters_counted,
                "by_stage_and_reason": [asdict(c) for c in self.dead_letters],
            },
        }


def _stream_json(stream: StreamState) -> dict[str, object]:
    return {
        "name": stream.name,
        "messages": stream.messages,
        "bytes": stream.bytes,
        "first_seq": stream.first_seq,
        "last_seq": stream.last_seq,
        "consumers": [{**asdict(lag), "backlog": lag.backlog} for lag in stream.consumers],
    }


async def count_dead_letters(
    plane: DataPlane, stored: int, last_seq: int, limit: int
) -> tuple[list[DeadLetterCount], int]:
    """The newest ``limit`` dead letters counted by (stage, reason), and how many were read."""
    counts: Counter[tuple[str, str]] = Counter()
    read = 0
    if stored:
        start = max(1, last_seq - limit + 1)
        async for message in plane.replay(plane.names.dead_letters, from_seq=start, limit=limit):
            read += 1
            letter = decode_stored(message)
            if isinstance(letter, DeadLetter):
                counts[(letter.stage, letter.reason)] += 1
            else:
                reason = letter.reason if isinstance(letter, Undecodable) else "not_a_dead_letter"
                counts[(UNKNOWN_STAGE, f"undecodable:{reason}")] += 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [DeadLetterCount(stage, reason, n) for (stage, reason), n in ordered], read


async def gather_overview(
    plane: DataPlane,
    *,
    dead_letter_limit: int,
    clock: Callable[[], float] = time.time,
) -> FleetOverview:
    """The view now; at most the newest ``dead_letter_limit`` dead letters are counted (each is
    decoded to read its stage), and the view says how many the stream holds."""
    streams = await plane.streams()
    names = {s.name for s in streams}
    # A broker provisioned before roles beat on the plane has no heartbeats stream: no roles
    # to show, and asking it would only wait for an answer that never comes.
    has_heartbeats = plane.names.heartbeats_stream.name in names
    heartbeats = await read_heartbeats(plane) if has_heartbeats else []
    overview = FleetOverview(plane.names.namespace, clock(), heartbeats, streams)
    if not has_heartbeats:
        overview.notes.append(
            f"no stream {plane.names.heartbeats_stream.name}: this broker was provisioned "
            "before roles published heartbeats"
        )
    dead = next((s for s in streams if s.name == plane.names.dead_letters_stream.name), None)
    if dead is not None:
        overview.dead_letters_stored = dead.messages
        overview.dead_letters, overview.dead_letters_counted = await count_dead_letters(
            plane, dead.messages, dead.last_seq, dead_letter_limit
        )
    return overview


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _name_column(table: Table, title: str, names: list[str]) -> None:
    """A column of names people copy into the next command: never elided nor wrapped."""
    table.add_column(title, no_wrap=True, min_width=max(map(len, names), default=len(title)))


def _roles_table(overview: FleetOverview) -> Table:
    beats = [r for r in overview.heartbeats if isinstance(r, Heartbeat)]
    table = Table(title=f"roles of {overview.namespace}", title_justify="left")
    _name_column(table, "role", [b.role for b in beats])
    _name_column(table, "instance", [b.instance for b in beats])
    for column in ("state", "seen", "version", "received (/s)", "published", "refused/failed"):
        table.add_column(column, overflow="fold")
    table.add_column("detail", overflow="fold", ratio=1)
    for record in overview.heartbeats:
        if isinstance(record, BadHeartbeat):
            table.add_row("?", record.subject, "[red]bad record[/]", *[""] * 4, record.reason)
            continue
        age = overview.taken_at_unix_s - record.sent_at_unix_s
        state = f"[red]silent[/] ({record.state})" if overview.silent(record) else record.state
        table.add_row(
            record.role,
            record.instance,
            state,
            f"{age:.0f}s ago",
            "-" if record.weight_version is None else str(record.weight_version),
            f"{record.received} ({_number(record.received_per_s)})",
            str(record.published),
            f"{record.refused}/{record.failures}",
            record.detail,
        )
    if not overview.heartbeats:
        table.caption = "; ".join(overview.notes) or (
            "no heartbeats: no role of this namespace beat in the last hour"
        )
    return table


def _streams_table(overview: FleetOverview) -> Table:
    table = Table(title="streams and consumer lag", title_justify="left")
    _name_column(table, "stream", [s.name for s in overview.streams])
    _name_column(table, "consumer", [c.durable for s in overview.streams for c in s.consumers])
    for column in ("messages", "bytes", "pending", "in flight", "redelivered"):
        table.add_column(column, overflow="fold")
    for stream in overview.streams:
        table.add_row(stream.name, "", str(stream.messages), str(stream.bytes), "", "", "")
        for lag in stream.consumers:
            table.add_row(
                "", lag.durable, "", "", str(lag.pending), str(lag.ack_pending),
                str(lag.redelivered),
            )  # fmt: skip
    return table


def render_overview(overview: FleetOverview) -> Group:
    """The terminal view: roles, streams with their consumers' lag, dead letters."""
    dead = Table(
        title=f"dead letters ({overview.dead_letters_stored} stored, "
        f"{overview.dead_letters_counted} newest counted)",
        title_justify="left",
    )
    _name_column(dead, "stage", [c.stage for c in overview.dead_letters])
    _name_column(dead, "reason", [c.reason for c in overview.dead_letters])
    dead.add_column("count")
    for count in overview.dead_letters:
        dead.add_row(count.stage, count.reason, str(count.count))
    return Group(_roles_table(overview), _streams_table(overview), dead)
