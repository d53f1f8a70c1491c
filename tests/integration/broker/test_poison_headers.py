"""Malformed headers on every subject a role consumes (issue #17): each poison is dead-lettered
once with the reason docs/wire-format.md gives it, the consumer carries on with the next
message, and history readers (replay tools, the trainer's resume, weight watches) show it as
undecodable with that reason instead of failing on it. Both planes, one real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from broker_test_utils import collect, eventually
from poison_headers import CORPUS, Poison, publish_poison

from dockyard.broker import exhausted
from dockyard.broker.dead_letters import read_dead_letter
from dockyard.broker.embedded import EmbeddedNatsServer
from dockyard.broker.inspect import export_record, summarise
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.names import ConsumerSpec
from dockyard.broker.plane import (
    HEADER_UNREADABLE,
    PLANE_STAGE,
    REASON_MAX_DELIVERIES,
    DataPlane,
)
from dockyard.broker.typed import MessagePlane
from dockyard.cli import main
from dockyard.config.sections.data_plane import DataPlaneConfig
from dockyard.schemas import (
    DeadLetter,
    Message,
    PromptGroup,
    Rollout,
    SampleScore,
    ScoredRollout,
    WeightVersion,
    encode,
)
from tests.integration.roles.factories import prompt_group, rollout

CODEC_REASONS = {"unknown_schema", "unexpected_schema", "header_mismatch", "unsupported_codec"}


def _weight_version(version: int) -> WeightVersion:
    return WeightVersion(
        version=version,
        step=version,
        blob_ref=f"blob://v{version}",
        digest="sha256:" + f"{version:064x}",
        nbytes=10,
        created_at_unix_s=1.0,
        producer_id="trainer-0",
    )


def _scored(group_id: str) -> ScoredRollout:
    return ScoredRollout(
        rollout=rollout(prompt_group(group_id), ["46", "47"]),
        scores=[SampleScore(sample_index=0, reward=1.0), SampleScore(sample_index=1, reward=0.0)],
        scorer_id="scorer-0",
    )


@dataclass(frozen=True)
class Route:
    """A subject, the durable consumer a role reads it with, and messages it carries."""

    subject: Callable[[DataPlane], str]
    consumer: Callable[[DataPlane], ConsumerSpec]
    kind: type[Message]
    make: Callable[[str], Message]


ROUTES = {
    "prompts -> rollout worker": Route(
        lambda p: p.names.prompts, lambda p: p.names.prompt_consumer, PromptGroup, prompt_group
    ),
    "rollouts -> scorer": Route(
        lambda p: p.names.rollouts,
        lambda p: p.names.rollout_consumer,
        Rollout,
        lambda g: rollout(prompt_group(g), ["46", "47"]),
    ),
    "scored -> trainer": Route(
        lambda p: p.names.scored, lambda p: p.names.scored_consumer, ScoredRollout, _scored
    ),
}


def _group_id(message: Message) -> str:
    return str(message.message_id())


async def _publish_corpus(
    plane: DataPlane, subject: str, make: Callable[[str], Message]
) -> dict[int, Poison]:
    """good-first, every poison (each a well-formed message underneath), good-last; the
    poisons by stream sequence."""
    typed = MessagePlane(plane, stage="publisher")
    await typed.publish(make("good-first"))
    poisons: dict[int, Poison] = {}
    for index, poison in enumerate(CORPUS):
        ack = await publish_poison(plane, subject, make(f"poison-{index}"), poison, f"p{index}")
        assert not ack.duplicate
        poisons[ack.seq] = poison
    await typed.publish(make("good-last"))
    return poisons


async def _dead_letters(plane: DataPlane, count: int) -> list:
    async def enough() -> list | None:
        letters = [read_dead_letter(m) for m in await collect(plane, plane.names.dead_letters)]
        return letters if len(letters) >= count else None

    return await eventually(enough, what=f"{count} dead letters")


@pytest.mark.parametrize("route_name", list(ROUTES))
async def test_every_malformed_header_is_dead_lettered_once_and_the_consumer_carries_on(
    plane: DataPlane, route_name: str
) -> None:
    route = ROUTES[route_name]
    subject = route.subject(plane)
    poisons = await _publish_corpus(plane, subject, route.make)
    expected = {seq: poison.reason for seq, poison in poisons.items()}
    typed = MessagePlane(plane, stage="role")

    received: list[str] = []
    # A batch that was all poison comes back empty; the next one goes on past it. Each fetch
    # takes at least one message, so a consumer that carries on is done in this many.
    for _ in range(len(CORPUS) + 2):
        for item in await typed.fetch(route.consumer(plane), route.kind, timeout_s=2):
            received.append(_group_id(item.message))
            await item.ack()
        if "good-last" in " ".join(received):
            break
    else:
        raise AssertionError(f"the consumer stalled after {received}")
    assert [r.split(":")[1] for r in received] == ["good-first", "good-last"]

    letters = await _dead_letters(plane, len(expected))
    assert {letter.original_stream_seq: letter.reason for letter in letters} == expected
    for letter in letters:
        # The plane refuses what it cannot read before any role sees it; the codec's refusals
        # are the role's own.
        assert letter.stage == ("role" if letter.reason in CODEC_REASONS else PLANE_STAGE)
        assert letter.original_subject == subject
    assert sum(typed.dead_lettered.values()) == sum(r in CODEC_REASONS for r in expected.values())
    assert await typed.fetch(route.consumer(plane), route.kind, timeout_s=0.3) == []


@pytest.mark.parametrize("route_name", list(ROUTES))
async def test_history_shows_every_malformed_header_as_undecodable_with_its_reason(
    plane: DataPlane, route_name: str
) -> None:
    route = ROUTES[route_name]
    subject = route.subject(plane)
    poisons = await _publish_corpus(plane, subject, route.make)
    expected = {seq: poison.reason_in_history() for seq, poison in poisons.items()}

    stored = await collect(plane, subject)  # what replay and the trainer's resume read
    assert len(stored) == len(expected) + 2
    good = [m for m in stored if m.seq not in expected]
    assert [summarise(m).schema for m in good] == [route.kind.SCHEMA_NAME] * 2
    for message in stored:
        if message.seq not in expected:
            continue
        reason = expected[message.seq]
        summary = summarise(message)
        assert summary.schema == "<undecodable>"
        assert summary.note.startswith(f"{reason}: ")
        assert export_record(message)["error"]["reason"] == reason  # type: ignore[index]
        # What the plane could not read is empty: no reader decodes the body underneath.
        if reason not in CODEC_REASONS:
            assert message.data == b""
            assert message.headers[HEADER_UNREADABLE].startswith(f"{reason}: ")
    for message in good:
        assert HEADER_UNREADABLE not in message.headers
    # Reading history raised nothing, and refused nothing: it dead-letters no one.
    assert await collect(plane, plane.names.dead_letters) == []


async def test_the_weight_watch_passes_over_malformed_events(plane: DataPlane) -> None:
    typed = MessagePlane(plane, stage="rollout")
    names = plane.names
    await typed.publish(_weight_version(1))
    versions = typed.weight_versions()
    assert (await anext(versions)).version == 1
    for index, poison in enumerate(CORPUS):
        # Each poison is a well-formed event underneath, of a version the watch must not see.
        await publish_poison(
            plane, names.weight_events, _weight_version(100 + index), poison, f"w{index}"
        )
    await typed.publish(_weight_version(2))
    async with asyncio.timeout(10):
        assert (await anext(versions)).version == 2
    await versions.aclose()


async def test_a_weight_watch_started_on_a_poison_event_begins_with_the_newest_good_one(
    plane: DataPlane,
) -> None:
    typed = MessagePlane(plane, stage="rollout")
    names = plane.names
    await typed.publish(_weight_version(1))
    await typed.publish(_weight_version(2))
    for index, poison in enumerate(CORPUS):
        await publish_poison(
            plane, names.weight_events, _weight_version(100 + index), poison, f"w{index}"
        )
    versions = typed.weight_versions()
    async with asyncio.timeout(10):
        assert (await anext(versions)).version == 2
    await versions.aclose()


async def test_the_current_weight_version_is_the_newest_that_decodes(plane: DataPlane) -> None:
    # What a trainer reads when it (re)starts: a poison event on top must neither stop it nor
    # hide the versions already published (it would publish them again).
    typed = MessagePlane(plane, stage="trainer")
    names = plane.names
    await typed.publish(_weight_version(1))
    await typed.publish(_weight_version(2))
    for index, poison in enumerate(CORPUS):
        await publish_poison(
            plane, names.weight_events, _weight_version(100 + index), poison, f"w{index}"
        )
        current = await typed.current_weight_version()
        assert current is not None and current.version == 2, poison.name


async def test_poison_on_the_dead_letter_subject_is_shown_not_fatal(plane: DataPlane) -> None:
    # The trainer reads dead letters (to let their groups go) and ``replay requeue`` plans from
    # them: a malformed one is skipped as undecodable by both; the good one after it is not.
    from dockyard.broker.requeue import Requeue, requeue_of

    names = plane.names

    def letter(index: int) -> DeadLetter:
        return DeadLetter(
            original_subject=names.rollouts,
            original_payload=b"refused",
            original_message_id=f"rollout:g{index}:0",
            stage="scorer",
            reason="corrupt_frame",
            message="not a frame",
        )

    expected = await _publish_corpus(plane, names.dead_letters, lambda g: letter(len(g)))
    stored = await collect(plane, names.dead_letters)
    assert len(stored) == len(expected) + 2
    for message in stored:
        outcome = requeue_of(message, names)
        if message.seq in expected:
            assert summarise(message).schema == "<undecodable>"
            assert outcome.why.startswith("undecodable dead letter")  # type: ignore[union-attr]
        else:
            assert isinstance(outcome, Requeue)


# -- JetStream only --------------------------------------------------------------------------
async def test_a_poison_that_exhausts_its_deliveries_is_dead_lettered_from_the_advisory(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: Callable[..., DataPlaneConfig]
) -> None:
    # A reader that never acks (an older build that does not read the headers, say) lets the
    # poison run out of deliveries; the plane that hears the advisory reads it back from the
    # stream to dead-letter it, and that read must not fail on its headers.
    async with JetStreamPlane(data_plane_config_factory(nats_server.url)) as plane:
        names = plane.names
        spec = ConsumerSpec(
            f"{names.namespace}_never_acks", names.experience_stream.name, names.rollouts
        )
        await plane.ensure_consumer(spec)
        advisories = await exhausted.watch(plane, spec)
        poison = CORPUS[0]
        ack = await publish_poison(
            plane, names.rollouts, rollout(prompt_group("g"), ["1", "2"]), poison, "p"
        )
        nc = await nats.connect(nats_server.url)
        try:
            reader = await nc.jetstream().pull_subscribe_bind(spec.durable, spec.stream)

            async def dead_lettered() -> list:
                with contextlib.suppress(nats.errors.TimeoutError):
                    await reader.fetch(1, timeout=0.5)  # taken, never acked
                return await collect(plane, names.dead_letters)

            [stored] = await eventually(
                dead_lettered, timeout_s=20, what="the advisory's dead letter"
            )
        finally:
            await nc.close()
            await advisories.unsubscribe()  # type: ignore[attr-defined]
        letter = read_dead_letter(stored)
        assert letter.reason == REASON_MAX_DELIVERIES
        assert letter.original_stream_seq == ack.seq


async def _publish_raw(url: str, subject: str, header_lines: bytes, payload: bytes) -> None:
    """One HPUB with header bytes nats-py would never write (invalid UTF-8, a header twice)."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()  # INFO
        block = b"NATS/1.0\r\n" + header_lines + b"\r\n"
        writer.write(b'CONNECT {"verbose":false,"headers":true,"protocol":1}\r\n')
        writer.write(
            f"HPUB {subject} {len(block)} {len(block) + len(payload)}\r\n".encode()
            + block
            + payload
            + b"\r\nPING\r\n"
        )
        await writer.drain()
        assert (await reader.readline()).strip() == b"PONG"  # the server has it
    finally:
        writer.close()
        await writer.wait_closed()


async def test_raw_header_bytes_nats_py_cannot_write_are_refused_too(
    nats_server: EmbeddedNatsServer, data_plane_config_factory: Callable[..., DataPlaneConfig]
) -> None:
    async with JetStreamPlane(data_plane_config_factory(nats_server.url)) as plane:
        names = plane.names
        typed = MessagePlane(plane, stage="scorer")
        body = encode(rollout(prompt_group("raw"), ["1", "2"])).payload
        ref, sha = b"a" * 32, b"0" * 64
        well_formed = (
            b"Dockyard-Chunk-Ref: %s\r\nDockyard-Payload-Size: 10\r\n"
            b"Dockyard-Payload-Sha256: %s\r\n" % (ref, sha)
        )
        raw = {
            "not UTF-8": b"Dockyard-Chunks: \xff\xfe\r\n" + well_formed,
            "twice, the second bad": b"Dockyard-Chunks: 1\r\nDockyard-Chunks: x\r\n" + well_formed,
            "twice, both bad": b"Dockyard-Chunks: x\r\nDockyard-Chunks: -1\r\n" + well_formed,
        }
        for index, lines in enumerate(raw.values()):
            await _publish_raw(
                nats_server.url, names.rollouts, b"Nats-Msg-Id: raw%d\r\n" % index + lines, body
            )
        await typed.publish(rollout(prompt_group("after"), ["1", "2"]))

        received = await eventually(
            lambda: typed.fetch(names.rollout_consumer, Rollout, timeout_s=0.5), what="the good one"
        )
        assert [item.message.group.group_id for item in received] == ["after"]
        letters = await _dead_letters(plane, len(raw))
        assert sorted(letter.reason for letter in letters) == ["bad_header"] * len(raw)


def test_replay_show_and_export_list_poison_and_exit_0(
    nats_server: EmbeddedNatsServer,
    data_plane_config_factory: Callable[..., DataPlaneConfig],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    config = data_plane_config_factory(nats_server.url)

    async def publish() -> dict:
        async with JetStreamPlane(config) as plane:
            return await _publish_corpus(plane, plane.names.scored, _scored)

    expected = {seq: p.reason_in_history() for seq, p in asyncio.run(publish()).items()}
    target = ["--url", nats_server.url, "--namespace", config.namespace]
    assert main(["replay", "show", "--subject", "scored", "--limit", "100", *target]) == 0
    shown = capsys.readouterr().out
    assert shown.count("<undecodable>") == len(expected)
    assert "good-first" in shown and "good-last" in shown
    out = tmp_path / "scored.jsonl"
    assert main(["replay", "export", "--subject", "scored", "--out", str(out), *target]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["seq"]: r["error"]["reason"] for r in records if "error" in r} == expected
    assert [r["schema"] for r in records if "error" not in r] == ["scored_rollout"] * 2
