"""``dockyard replay ls|show|export|requeue``: look into the streams of a running data plane
(``trace`` lives in :mod:`dockyard.commands._replay_trace`, ``rescore`` and ``diff`` in
:mod:`dockyard.commands._replay_rescore`, ``retrain`` in :mod:`dockyard.commands._replay_retrain`).

    dockyard replay ls      (--config PATH [overrides] | --url nats://...)
    dockyard replay show    --subject S [--from-seq N | --since TIME] [--limit K] (...)
    dockyard replay export  --subject S [--from-seq N | --since TIME] [--limit K] --out F.jsonl
                            [--format jsonl|parquet]
    dockyard replay requeue [--reason R ...] [--from-seq N | --since TIME] [--limit K] [--dry-run]

``--subject`` takes a full subject or a short name: prompts, rollouts, scored, weights, dead.
Inspection creates and acks nothing (it reads with direct gets only); ``requeue`` is the one
command that writes: it re-publishes dead letters' original bytes to their original subjects.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from dockyard.commands._cli import CliError, CommandRegistrar, add_subcommands
from dockyard.commands._plane_args import add_plane_arguments, open_running_plane
from dockyard.utils.sizes import human_bytes

if TYPE_CHECKING:  # imported lazily at run time: each subcommand loads only what it uses
    from dockyard.broker.inspect import MessageSummary
    from dockyard.broker.jetstream import JetStreamPlane
    from dockyard.broker.messages import PublishAck
    from dockyard.broker.names import PlaneNames
    from dockyard.broker.parquet_export import ExportResult
    from dockyard.broker.plane import StreamState
    from dockyard.broker.requeue import Requeue, Skipped

_T = TypeVar("_T")

DEFAULT_SHOW_LIMIT = 50


def _open_plane(args: argparse.Namespace) -> JetStreamPlane:
    return open_running_plane(args, command="replay")


def _ls(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    async def run() -> tuple[str, list[StreamState]]:
        async with _open_plane(args) as plane:
            return plane.names.namespace, await plane.streams()

    namespace, states = _run(run())

    # Every stream and subject of a namespace starts with it: said once in the title, the
    # names fit 80 columns. What is left is what `replay show --subject` takes.
    def short(name: str) -> str:
        return name.removeprefix(f"{namespace}_").removeprefix(f"{namespace}.")

    table = Table(title=f"streams of namespace {namespace}", box=box.SIMPLE_HEAD)
    table.add_column("stream", no_wrap=True)
    for column in ("msgs", "size", "seq range"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("last (UTC)", no_wrap=True)
    table.add_column("retention", no_wrap=True)
    table.add_column("subjects", overflow="fold")
    consumers = Table(title="consumers", box=box.SIMPLE_HEAD)
    consumers.add_column("consumer", no_wrap=True)
    consumers.add_column("stream", no_wrap=True)
    for column in ("pending", "unacked", "redelivered"):
        consumers.add_column(column, justify="right", no_wrap=True)
    for state in states:
        last = (
            state.last_time.astimezone(UTC).strftime("%m-%d %H:%M:%S") if state.last_time else "-"
        )
        table.add_row(
            short(state.name),
            str(state.messages),
            human_bytes(state.bytes),
            f"{state.first_seq}..{state.last_seq}",
            last,
            state.retention,
            "\n".join(short(subject) for subject in state.subjects),
        )
        for lag in state.consumers:
            consumers.add_row(
                short(lag.durable),
                short(lag.stream),
                str(lag.pending),
                str(lag.ack_pending),
                str(lag.redelivered),
            )
    console = Console()
    console.print(table)
    console.print(consumers)
    return 0


class _Selection(TypedDict):
    """Which stored messages to read: ``DataPlane.replay``'s keyword arguments."""

    from_seq: int | None
    since: datetime | None
    limit: int | None


def _selection(args: argparse.Namespace, names: PlaneNames) -> tuple[str, _Selection]:
    from dockyard.broker.inspect import parse_since, resolve_subject

    if args.from_seq is not None and args.since is not None:
        raise CliError("give --from-seq or --since, not both")
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as error:
        raise CliError(str(error)) from None
    subject = resolve_subject(names, args.subject)
    try:
        names.stream_for_subject(subject)
    except KeyError:
        raise CliError(
            f"--subject {args.subject}: no stream of namespace {names.namespace!r} holds it; "
            "give a short name (prompts, rollouts, scored, weights, dead) or a subject that "
            "`dockyard replay ls` lists"
        ) from None
    return subject, {
        "from_seq": args.from_seq,
        "since": since,
        "limit": args.limit,
    }


def _show(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from dockyard.broker.inspect import summarise

    async def run() -> tuple[str, list[MessageSummary]]:
        async with _open_plane(args) as plane:
            subject, selection = _selection(args, plane.names)
            current = await _current_version(plane)
            if args.group is None:
                replayed = plane.replay(subject, **selection)
                return subject, [summarise(stored, current) async for stored in replayed]
            # The limit counts this group's messages: the whole selection is read for them.
            limit, selection["limit"] = selection["limit"], None
            rows: list[MessageSummary] = []
            async for stored in plane.replay(subject, **selection):
                row = summarise(stored, current)
                if row.group_id == args.group:
                    rows.append(row)
                    if limit is not None and len(rows) >= limit:
                        break
            return subject, rows

    subject, rows = _run(run())
    table = Table(title=f"{subject} ({len(rows)} messages)")
    columns = (
        "seq",
        "time",
        "schema",
        "group",
        "env",
        "weights",
        "stale",
        "rewards",
        "lengths",
        "note",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row.seq),
            row.time.isoformat(timespec="seconds"),
            row.schema,
            row.group_id,
            row.environment,
            row.weight_version,
            row.staleness,
            " ".join(f"{r:.3g}" for r in row.rewards),
            " ".join(str(n) for n in row.lengths),
            row.note,
        )
    Console(width=200).print(table)
    return 0


async def _current_version(plane: JetStreamPlane) -> int | None:
    from dockyard.schemas import CodecError, WeightVersion, decode

    stored = await plane.current_weight_event()
    if stored is None:
        return None
    try:
        return decode(stored.headers, stored.data, expected=WeightVersion).version
    except CodecError:
        return None


def _export(args: argparse.Namespace) -> int:
    from dockyard.broker.inspect import export_record

    out = Path(args.out)
    if args.format == "parquet":
        return _export_parquet(args, out)

    async def run() -> int:
        count = 0
        async with _open_plane(args) as plane:
            subject, selection = _selection(args, plane.names)
            with out.open("w") as handle:
                async for stored in plane.replay(subject, **selection):
                    handle.write(json.dumps(export_record(stored)) + "\n")
                    count += 1
        return count

    count = _run(run())
    print(f"wrote {count} messages to {out}")
    return 0


def _export_parquet(args: argparse.Namespace, out: Path) -> int:
    """Scored groups as Parquet rows; every message left out is named on stderr and kept, with
    its bytes, in ``OUT.refused.jsonl``, and the exit status is 1."""
    from dockyard.broker.inspect import export_record
    from dockyard.broker.parquet_export import export_parquet

    async def run() -> ExportResult:
        async with _open_plane(args) as plane:
            subject, selection = _selection(args, plane.names)
            return await export_parquet(plane.replay(subject, **selection), out)

    result = _run(run())
    print(f"wrote {result.rows} samples of {result.groups} groups to {out}")
    if not result.refused:
        return 0
    side = out.with_name(out.name + ".refused.jsonl")
    with side.open("w") as handle:
        for item in result.refused:
            record = export_record(item.stored)
            record["refused"] = {"reason": item.reason, "detail": item.detail}
            handle.write(json.dumps(record) + "\n")
            print(f"left out seq {item.stored.seq}: {item.reason}: {item.detail}", file=sys.stderr)
    print(f"{len(result.refused)} messages left out, listed in {side}", file=sys.stderr)
    return 1


def _requeue(args: argparse.Namespace) -> int:
    from dockyard.broker.requeue import plan_requeue

    args.subject = "dead"

    async def run() -> tuple[list[Requeue], list[Skipped], list[PublishAck]]:
        async with _open_plane(args) as plane:
            subject, selection = _selection(args, plane.names)
            chosen, skipped = await plan_requeue(
                plane.replay(subject, **selection), plane.names, frozenset(args.reason or ())
            )
            acks = [] if args.dry_run else await plane.publish_many([r.message for r in chosen])
            return chosen, skipped, acks

    chosen, skipped, acks = _run(run())
    for item in skipped:
        print(f"skipped dead letter {item.dead_letter_seq}: {item.why}")
    if args.dry_run:
        for planned in chosen:
            print(
                f"would re-queue dead letter {planned.dead_letter_seq} ({planned.reason}) to "
                f"{planned.message.subject}"
            )
        print(f"dry run: {len(chosen)} to re-queue, {len(skipped)} cannot be")
        return 0
    again = sum(1 for ack in acks if ack.duplicate)
    print(
        f"re-queued {len(acks) - again} dead letters"
        + (f" ({again} already re-queued within the dedupe window)" if again else "")
        + (f"; {len(skipped)} cannot be" if skipped else "")
    )
    return 0


def _run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    from dockyard.broker.plane import DataPlaneError

    try:
        return asyncio.run(coroutine)
    except DataPlaneError as error:
        raise CliError(str(error)) from None


def _add_selection(parser: argparse.ArgumentParser, *, default_limit: int | None) -> None:
    parser.add_argument(
        "--subject",
        required=True,
        help="subject or short name: prompts rollouts scored weights dead",
    )
    parser.add_argument("--from-seq", type=int, help="first stream sequence")
    parser.add_argument("--since", help="ISO-8601 time or relative (10m, 2h)")
    parser.add_argument("--limit", type=int, default=default_limit, help="at most K messages")


def register(registrar: CommandRegistrar) -> None:
    parser = registrar.add("replay", help="Inspect and export the streams of a running data plane")
    commands = add_subcommands(parser, dest="replay_command")

    ls = commands.add("ls", help="Streams, subjects, sequence ranges, sizes, consumers and lag")
    add_plane_arguments(ls)
    ls.set_defaults(handler=_ls)

    show = commands.add("show", help="A table of messages: seq, time, group, env, weights, rewards")
    _add_selection(show, default_limit=DEFAULT_SHOW_LIMIT)
    show.add_argument(
        "--group", metavar="ID", help="only this prompt group's messages (--limit counts them)"
    )
    add_plane_arguments(show)
    show.set_defaults(handler=_show)

    export = commands.add(
        "export", help="Decoded messages as JSON lines, or scored samples as Parquet rows"
    )
    _add_selection(export, default_limit=None)
    export.add_argument("--out", required=True, metavar="FILE")
    export.add_argument(
        "--format",
        choices=("jsonl", "parquet"),
        default="jsonl",
        help="jsonl: every message; parquet: one row per scored sample (docs/wire-format.md)",
    )
    add_plane_arguments(export)
    export.set_defaults(handler=_export)

    requeue = commands.add(
        "requeue", help="Re-publish dead letters' original messages to their original subjects"
    )
    requeue.add_argument(
        "--reason", action="append", help="only dead letters with this reason (repeatable)"
    )
    requeue.add_argument("--from-seq", type=int, help="first dead-letter stream sequence")
    requeue.add_argument("--since", help="ISO-8601 time or relative (10m, 2h)")
    requeue.add_argument("--limit", type=int, default=None, help="at most K dead letters")
    requeue.add_argument("--dry-run", action="store_true", help="list, publish nothing")
    add_plane_arguments(requeue)
    requeue.set_defaults(handler=_requeue)

    from dockyard.commands import _replay_rescore, _replay_retrain, _replay_trace

    # The plane helpers are handed over, not imported back: _replay_trace stays a leaf.
    _replay_trace.register(commands, open_plane=_open_plane, run=_run)
    _replay_retrain.register(commands)
    _replay_rescore.register(
        commands,
        open_plane=_open_plane,
        run=_run,
        selection=_selection,
        add_selection=_add_selection,
    )
