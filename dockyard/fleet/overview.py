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
from rich.text import Text

from dockyard.broker.admin import AdminPlane
from dockyard.broker.heartbeats import BadHeartbeat, Heartbeat, is_silent, read_heartbeats
from dockyard.broker.inspect import Undecodable, decode_stored
from dockyard.broker.plane import DataPlane, StoredMessage, StreamState
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


def _stage_and_reason(message: StoredMessage) -> tuple[str, str]:
    letter = decode_stored(message)
    if isinstance(letter, DeadLetter):
        return letter.stage, letter.reason
    reason = letter.reason if isinstance(letter, Undecodable) else "not_a_dead_letter"
    return UNKNOWN_STAGE, f"undecodable:{reason}"


@dataclass
class DeadLetterTally:
    """The newest ``limit`` dead letters by (stage, reason), read on from where the last update
    stopped: a dashboard refreshing every few seconds decodes each dead letter once."""

    limit: int
    _by_seq: dict[int, tuple[str, str]] = field(default_factory=dict)
    _next_seq: int = 1

    async def update(self, plane: DataPlane, stream: StreamState) -> None:
        window_start = max(stream.first_seq, stream.last_seq - self.limit + 1, 1)
        # Forget what the stream no longer holds or what fell out of the newest ``limit``.
        self._by_seq = {seq: key for seq, key in self._by_seq.items() if seq >= window_start}
        start = max(self._next_seq, window_start)
        if stream.messages and start <= stream.last_seq:
            async for message in plane.replay(
                plane.names.dead_letters, from_seq=start, limit=stream.last_seq - start + 1
            ):
                if message.seq > stream.last_seq:
                    break
                self._by_seq[message.seq] = _stage_and_reason(message)
        self._next_seq = max(self._next_seq, stream.last_seq + 1)

    @property
    def counted(self) -> int:
        return len(self._by_seq)

    def counts(self) -> list[DeadLetterCount]:
        ordered = sorted(Counter(self._by_seq.values()).items(), key=lambda i: (-i[1], i[0]))
        return [DeadLetterCount(stage, reason, n) for (stage, reason), n in ordered]


async def gather_overview(
    plane: AdminPlane, tally: DeadLetterTally, *, clock: Callable[[], float] = time.time
) -> FleetOverview:
    """The view now; the dead letters are counted by ``tally`` (brought up to date: at most
    its ``limit`` newest, each decoded to read its stage), and the view says how many the
    stream holds."""
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
        await tally.update(plane, dead)
        overview.dead_letters_stored = dead.messages
        overview.dead_letters, overview.dead_letters_counted = tally.counts(), tally.counted
    return overview


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _name_column(table: Table, title: str, names: list[str]) -> None:
    """A column of names people copy into the next command, or of short values read at a
    glance: never elided nor wrapped (the detail column takes what width is left)."""
    widths = [len(title), *map(len, names)]
    table.add_column(title, no_wrap=True, min_width=max(widths))


def _role_row(overview: FleetOverview, record: Heartbeat) -> list[str]:
    age = overview.taken_at_unix_s - record.sent_at_unix_s
    state = f"silent ({record.state})" if overview.silent(record) else record.state
    return [
        record.role,
        record.instance,
        state,
        f"{age:.0f}s",
        "-" if record.weight_version is None else str(record.weight_version),
        f"{record.received} ({_number(record.received_per_s)}/s)",
        str(record.published),
        f"{record.refused}/{record.failures}",
    ]


def _roles_table(overview: FleetOverview) -> Group:
    """The roles' facts in a table, and below it what each one says it is doing (a detail
    can be a long error: on a line of its own it never squeezes the table)."""
    # age: seconds since its last beat; ref/fail: deliveries refused at decoding / failures.
    titles = ("role", "instance", "state", "age", "ver", "received", "sent", "ref/fail")
    rows: list[tuple[list[str], str]] = []
    for record in overview.heartbeats:
        if isinstance(record, BadHeartbeat):
            rows.append((["?", "?", "bad record", *[""] * 5], f"{record.subject}: {record.reason}"))
        else:
            rows.append((_role_row(overview, record), record.detail))
    table = Table(title=f"roles of {overview.namespace}", title_justify="left")
    for index, title in enumerate(titles):
        _name_column(table, title, [cells[index] for cells, _detail in rows])
    for cells, _detail in rows:
        style = "red" if cells[2].startswith(("silent", "bad record")) else None
        table.add_row(*cells, style=style)
    if not overview.heartbeats:
        table.caption = "; ".join(overview.notes) or (
            "no heartbeats: no role of this namespace beat in the last hour"
        )
    details = [
        Text(f"  {cells[0]} {cells[1]}: {detail}" if cells[0] != "?" else f"  {detail}")
        for cells, detail in rows
        if detail
    ]
    return Group(table, *details)


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
