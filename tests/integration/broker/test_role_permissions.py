"""`broker up --secure`: what each role's credential may do on a real server (issue #17).

Expectations come from docs/operations.md (Security): a role publishes only the data it produces,
pulls only from its own durables, reads only what it consumes, and creating, changing or deleting
streams and consumers is the admin's alone. The attacks use a raw nats-py connection with the
role's credential — anything a process holding it could send — and after them the admin checks
that no stream, message or consumer changed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import nats
import pytest
from broker_test_utils import SecuredBroker, collect, eventually, fetch_until
from nats.aio.client import Client as NatsClient

from dockyard.broker import exhausted
from dockyard.broker.connection import PermissionWatch
from dockyard.broker.heartbeats import Heartbeat, HeartbeatPublisher, read_heartbeats
from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.names import PlaneNames
from dockyard.broker.security import ROLE_API_PREFIX
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs import create_weight_store
from dockyard.models import build_arithmetic_policy
from dockyard.observability.status_files import StatusFile
from dockyard.schemas import Rollout, ScoredRollout, decode
from tests.integration.roles.factories import prompt_group, rollout
from tests.integration.roles.test_rollout_worker import (
    engine_over,
    publish_weights,
    running_worker,
)
from tests.integration.roles.test_scorer import running_scorer

ATTACKERS = ("rollout", "scorer", "trainer")
#: The API as a role may try to reach it: the server's own prefix and its account's imports.
PREFIXES = ("$JS.API", ROLE_API_PREFIX)


@dataclass
class Attacker:
    """A raw connection with one role's credential."""

    nc: NatsClient
    denials: PermissionWatch

    async def refused(self, subject: str, body: bytes = b"") -> None:
        """Send ``subject`` as a request; the server must refuse it as a permissions violation
        (an answer, even an error, means the call reached JetStream)."""
        denied = self.denials.denied(subject)
        answer = asyncio.ensure_future(self.nc.request(subject, body, timeout=5.0))
        try:
            done, _ = await asyncio.wait({denied, answer}, return_when=asyncio.FIRST_COMPLETED)
            assert denied in done, f"{subject} was answered: {answer.result().data[:200]!r}"
        finally:
            answer.cancel()
            self.denials.forget(subject, denied)


@asynccontextmanager
async def attacker(broker: SecuredBroker, role: str) -> AsyncIterator[Attacker]:
    credentials = broker.config(role).credentials
    denials = PermissionWatch()

    async def on_error(error: Exception) -> None:
        denials.record(str(error))

    nc = await nats.connect(
        broker.server.url,
        user=credentials.user,
        password=credentials.password,
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield Attacker(nc, denials)
    finally:
        await nc.close()


async def server_state(admin: JetStreamPlane) -> dict[str, object]:
    """Every stream's config and contents and every consumer's config, as the admin sees them."""
    state: dict[str, object] = {}
    for spec in admin.names.all_streams():
        info = await admin.js.stream_info(spec.name)
        state[spec.name] = (info.config.as_dict(), info.state.messages, info.state.last_seq)
        consumers = await admin.js.consumers_info(spec.name)
        state[f"{spec.name} consumers"] = sorted(
            json.dumps(c.config.as_dict(), sort_keys=True) for c in consumers
        )
    state["current weight event"] = await admin.current_weight_event()
    return state


def _stream_update(names: PlaneNames, stream: str) -> bytes:
    """The issue's attack, on any stream: take in a subject the attacker writes, transformed to
    the stream's own subject."""
    return json.dumps(
        {
            "name": stream,
            "subjects": [names.weight_events, f"{names.namespace}.leases.evil"],
            "subject_transform": {
                "src": f"{names.namespace}.leases.evil",
                "dest": names.weight_events,
            },
            "sources": [{"name": names.experience_stream.name}],
        }
    ).encode()


def change_attempts(names: PlaneNames) -> list[tuple[str, bytes]]:
    """Every JetStream API call that creates, changes or deletes a stream, a consumer or a
    stored message, account-wide calls and the APIs of key-value and object stores."""
    evil_consumer = json.dumps(
        {"stream_name": names.weights_stream.name, "config": {"deliver_subject": names.prompts}}
    ).encode()
    calls: list[tuple[str, bytes]] = []
    for api in PREFIXES:
        calls += [
            (
                f"{api}.STREAM.CREATE.evil",
                json.dumps({"name": "evil", "subjects": ["e.>"]}).encode(),
            ),
            (f"{api}.STREAM.CREATE.KV_weights", b"{}"),
            (f"{api}.STREAM.CREATE.OBJ_weights", b"{}"),
            (f"{api}.INFO", b""),
            (f"{api}.STREAM.LIST", b""),
            (f"{api}.STREAM.NAMES", b""),
            (f"{api}.ACCOUNT.PURGE", b""),
            (f"{api}.META.LEADER.STEPDOWN", b""),
        ]
        for stream in (spec.name for spec in names.all_streams()):
            calls += [
                (f"{api}.STREAM.UPDATE.{stream}", _stream_update(names, stream)),
                (f"{api}.STREAM.DELETE.{stream}", b""),
                (f"{api}.STREAM.MSG.GET.{stream}", b'{"seq": 1}'),
                (f"{api}.STREAM.SNAPSHOT.{stream}", b"{}"),
                (f"{api}.STREAM.RESTORE.{stream}", b"{}"),
                (f"{api}.CONSUMER.CREATE.{stream}", evil_consumer),
                (f"{api}.CONSUMER.CREATE.{stream}.evil.{names.weight_events}", evil_consumer),
                (f"{api}.CONSUMER.DURABLE.CREATE.{stream}.evil", evil_consumer),
            ]
        for consumer in names.consumers():
            calls += [
                (f"{api}.CONSUMER.DELETE.{consumer.stream}.{consumer.durable}", b""),
                (f"{api}.CONSUMER.CREATE.{consumer.stream}.{consumer.durable}", evil_consumer),
                (f"{api}.CONSUMER.PAUSE.{consumer.stream}.{consumer.durable}", b"{}"),
            ]
    return calls


#: Per role: (the streams it may not purge or delete messages from — all but what its own
#: work prunes —, the durables it does not pull from, the subjects other roles write, the
#: streams it has no reason to read). From docs/operations.md.
def forbidden(names: PlaneNames, role: str) -> dict[str, list[str]]:
    streams = [spec.name for spec in names.all_streams()]
    prunes = {
        "rollout": [],  # it removes exhausted prompts by message delete, never by purge
        "scorer": [],
        # It also trims a full experience stream's history (history_trim.py): JetStream's
        # permissions cannot tell a purge below the readers' ack floors from any other.
        "trainer": [
            names.blobs_stream.name,
            names.leases_stream.name,
            names.experience_stream.name,
        ],
    }[role]
    deletes = [names.prompts_stream.name] if role == "rollout" else []
    own = {
        "rollout": names.prompt_consumer,
        "scorer": names.rollout_consumer,
        "trainer": names.scored_consumer,
    }[role]
    others_write = {
        "rollout": [
            names.weight_events,
            names.scored,
            names.prompts,
            names.blob_data_subject("a"),
            names.heartbeat_subject("trainer", "0"),
        ],
        "scorer": [
            names.rollouts,
            names.weight_events,
            names.prompts,
            names.lease_subject("a", "b"),
            names.heartbeat_subject("rollout", "w"),
        ],
        "trainer": [
            names.rollouts,
            names.scored,
            names.lease_subject("a", "b"),
            names.heartbeat_subject("scorer", "s"),
        ],
    }[role]
    unread = {
        "rollout": [
            names.experience_stream.name,
            names.leases_stream.name,
            names.dead_letters_stream.name,
        ],
        "scorer": [
            names.weights_stream.name,
            names.blobs_stream.name,
            names.leases_stream.name,
            names.prompts_stream.name,
        ],
        # The trainer reads dead letters (it drops the groups they name, loop.py), which hold
        # only what it wrote itself (prompts) or reads anyway (rollouts, scored rollouts).
        "trainer": [names.prompts_stream.name],
    }[role]
    return {
        "purge": [s for s in streams if s not in prunes],
        "message delete": [s for s in streams if s not in deletes],
        "durables": [f"{c.stream}.{c.durable}" for c in names.consumers() if c != own],
        "publish": others_write,
        "unread": unread,
    }


@pytest.mark.parametrize("role", ATTACKERS)
async def test_a_role_cannot_change_what_another_role_reads(
    secured_broker: SecuredBroker, role: str
) -> None:
    names = secured_broker.names
    async with JetStreamPlane(secured_broker.config("trainer")) as trainer:
        await trainer.publish(names.weight_events, b"version 1", msg_id="weight_version:1")
        await trainer.publish(names.prompts, b"a prompt", msg_id="prompt:1")
    async with JetStreamPlane(secured_broker.config("admin")) as admin:
        before = await server_state(admin)
        deny = forbidden(names, role)
        async with attacker(secured_broker, role) as role_connection:
            for subject, body in change_attempts(names):
                await role_connection.refused(subject, body)
            for api in PREFIXES:
                for stream in deny["purge"]:
                    await role_connection.refused(f"{api}.STREAM.PURGE.{stream}", b"{}")
                for stream in deny["message delete"]:
                    await role_connection.refused(f"{api}.STREAM.MSG.DELETE.{stream}", b'{"seq":1}')
                for stream in deny["unread"]:
                    await role_connection.refused(f"{api}.DIRECT.GET.{stream}", b'{"seq": 1}')
                for durable in deny["durables"]:
                    # Pulling (and so acking) another role's input would take it from that role.
                    await role_connection.refused(f"{api}.CONSUMER.MSG.NEXT.{durable}", b"{}")
            for durable in deny["durables"]:
                await role_connection.refused(f"$JS.ACK.{durable}.1.1.1.1.0", b"+ACK")
            for subject in [*deny["publish"], "$KV.weights.current", "$O.weights.M.x", "_INBOX.x"]:
                await role_connection.refused(subject, b"forged")
            await role_connection.refused("$SYS.REQ.SERVER.PING", b"")
        assert await server_state(admin) == before


async def test_the_issues_attack_is_refused(secured_broker: SecuredBroker) -> None:
    """The rollout credential makes the weights stream take in a subject it may write (a lease
    subject, transformed to the weight-event subject), then publishes version 999 there."""
    names = secured_broker.names
    forged = f"{names.namespace}.leases.evil"
    async with JetStreamPlane(secured_broker.config("trainer")) as trainer:
        await trainer.publish(names.weight_events, b"version 1", msg_id="weight_version:1")
    async with attacker(secured_broker, "rollout") as rollout:
        for api in PREFIXES:
            # The lease stream first gives up the subject (streams may not overlap)...
            await rollout.refused(
                f"{api}.STREAM.UPDATE.{names.leases_stream.name}",
                json.dumps(
                    {
                        "name": names.leases_stream.name,
                        "subjects": [f"{names.namespace}.leases.*.*"],
                        "max_msgs_per_subject": 1,
                    }
                ).encode(),
            )
            # ...then the weights stream takes it in, transformed to the weight-event subject.
            await rollout.refused(
                f"{api}.STREAM.UPDATE.{names.weights_stream.name}",
                _stream_update(names, names.weights_stream.name),
            )
        ack = await rollout.nc.request(
            forged, b"version 999 from the rollout worker", timeout=5.0
        )  # a subject the rollout may write: it lands in the lease stream, nowhere else
        assert json.loads(ack.data)["stream"] == names.leases_stream.name
    async with JetStreamPlane(secured_broker.config("rollout")) as worker:
        current = await worker.current_weight_event()
        assert current is not None and current.data == b"version 1"


@pytest.mark.parametrize("role", ATTACKERS)
async def test_answers_go_back_to_the_asker_not_into_a_stream(
    secured_broker: SecuredBroker, role: str
) -> None:
    """Inside one account the server sends an answer wherever the request's reply subject says
    — a publish ack, a direct get carrying a message the attacker wrote — into any stream's
    subject too. Each role's account only ever gets its answers back."""
    names = secured_broker.names
    own = {"rollout": names.rollouts, "scorer": names.scored, "trainer": names.prompts}
    reads = names.chunks_stream.name  # every role reads chunks by direct get
    chunk = names.chunk_subject("evil", 0)
    # An answer does reach the asker's own imports: only subjects it may write itself.
    targets = forbidden(names, role)["publish"]
    async with JetStreamPlane(secured_broker.config("admin")) as admin:
        async with attacker(secured_broker, role) as role_connection:
            nc = role_connection.nc
            await nc.request(chunk, b"version 999 from the " + role.encode(), timeout=5.0)
            before = await server_state(admin)
            for target in targets:
                await nc.publish(own[role], b"a message", reply=target)
                for api in PREFIXES:
                    await nc.publish(f"{api}.DIRECT.GET.{reads}.{chunk}", b"", reply=target)
                    await nc.publish(f"{api}.STREAM.INFO.{reads}", b"", reply=target)
            # Answered in order: once this one is back, the ones above were sent and answered.
            await nc.request(f"{ROLE_API_PREFIX}.STREAM.INFO.{reads}", b"", timeout=5.0)
        after = await server_state(admin)
    own_stream = names.stream_for_subject(own[role]).name
    # Only the role's own stream grew (the messages it published itself).
    for name in before:
        if name != own_stream:
            assert after[name] == before[name], name


async def test_each_role_does_its_own_work_with_its_credential(
    secured_broker: SecuredBroker,
) -> None:
    names = secured_broker.names
    config = secured_broker.config
    # Small messages so that a rollout travels in chunks (reassembled by direct gets).
    small = {"max_payload": 64 * 1024}
    big_rollout = bytes(range(256)) * 1024
    async with (
        JetStreamPlane(config("trainer", **small)) as trainer,
        JetStreamPlane(config("rollout", **small)) as rollout,
        JetStreamPlane(config("scorer", **small)) as scorer,
    ):
        # The trainer publishes the first weights and hosts the dispatcher.
        store = create_weight_store(trainer)
        blob = await store.put(1, b"weights" * 1000)
        await trainer.publish(names.weight_events, b"version 1", msg_id="weight_version:1")
        await trainer.publish(names.prompts, b"prompt 1", msg_id="prompt:1")
        await trainer.publish(names.prompts, b"prompt 2", msg_id="prompt:2")
        # A rollout worker follows the weights (its watch needs no consumer), reads the blob
        # under a lease, pulls prompts, acks one and dead-letters an exhausted one.
        versions = rollout.watch(names.weight_events)
        assert (await anext(versions)).data == b"version 1"
        assert await create_weight_store(rollout, reader_id="w1").get_bytes(blob) == (
            b"weights" * 1000
        )
        prompts = await fetch_until(rollout, names.prompt_consumer, 2)
        assert [p.data for p in prompts] == [b"prompt 1", b"prompt 2"]
        await prompts[0].ack()
        await rollout.publish(names.rollouts, big_rollout, msg_id="rollout:1")
        await exhausted.dead_letter(rollout, names.prompt_consumer, prompts[1].as_stored(), 3)
        await trainer.publish(names.weight_events, b"version 2", msg_id="weight_version:2")
        assert (await anext(versions)).data == b"version 2"
        await versions.aclose()
        # A scorer pulls the rollout (reassembled from its chunks) and publishes its score.
        (delivered,) = await fetch_until(scorer, names.rollout_consumer, 1)
        assert delivered.data == big_rollout
        assert (await scorer.get(delivered.stream, delivered.seq)).data == big_rollout
        await scorer.publish(names.scored, b"scored 1", msg_id="scored:1")
        await delivered.ack()
        # The trainer pulls it, replays its history, reports lag and prunes old blobs.
        (scored,) = await fetch_until(trainer, names.scored_consumer, 1)
        await scored.ack()
        assert [m.data for m in await collect(trainer, names.scored)] == [b"scored 1"]
        assert {s.name for s in await trainer.streams()} >= {names.prompts_stream.name}
        assert (await trainer.consumer_lag(names.prompt_consumer)).backlog == 0
        await store.delete(blob)
        assert await store.refs() == []
        await trainer.purge(names.leases_of(blob.hex))
        # Each role beats under its own role's name (dockyard status reads them as admin).
        for role, plane in (("trainer", trainer), ("rollout", rollout), ("scorer", scorer)):
            await HeartbeatPublisher(plane, StatusFile(None, role, "host.lan-1")).beat()

    async with JetStreamPlane(config("admin")) as admin:
        beats = await read_heartbeats(admin)
        assert sorted((b.role, b.instance) for b in beats if isinstance(b, Heartbeat)) == [
            ("rollout", "host.lan-1"),
            ("scorer", "host.lan-1"),
            ("trainer", "host.lan-1"),
        ]

        async def queue_is_empty() -> bool:
            info = await admin.js.stream_info(names.prompts_stream.name)
            return info.state.messages == 0

        await eventually(queue_is_empty, what="the acked and the exhausted prompt gone")
        (letter,) = await collect(admin, names.dead_letters)
        assert letter.headers["Dockyard-Original-Subject"] == names.prompts


async def test_a_rollout_worker_runs_with_the_rollout_credential(
    secured_broker: SecuredBroker,
) -> None:
    """The real worker: it follows the weights the trainer publishes, refits from their blobs
    under a lease, pulls a prompt group and publishes its rollout."""
    trained, tokenizer = build_arithmetic_policy(seed=1)
    engine_model, _ = build_arithmetic_policy(seed=0)
    names = secured_broker.names
    async with (
        JetStreamPlane(secured_broker.config("trainer")) as trainer,
        JetStreamPlane(secured_broker.config("rollout")) as worker_plane,
    ):
        messages = MessagePlane(trainer, stage="trainer")
        store = create_weight_store(trainer)
        await publish_weights(messages, store, 0, trained.state_dict())
        await messages.publish(prompt_group("g-1", generations=2))
        worker_store = create_weight_store(worker_plane, reader_id="w-test")
        engine = engine_over(engine_model, tokenizer)
        async with running_worker(worker_plane, worker_store, engine) as worker:
            (stored,) = await eventually(lambda: collect(trainer, names.rollouts), what="rollout")
            assert decode(stored.headers, stored.data, expected=Rollout).group_id == "g-1"
            await publish_weights(messages, store, 1, trained.state_dict())

            async def refitted_twice() -> bool:
                return worker.refits == 2

            await eventually(refitted_twice, what="the refit to version 1")


async def test_a_scorer_runs_with_the_scorer_credential(secured_broker: SecuredBroker) -> None:
    """The real scorer pulls what a rollout worker published and the trainer pulls its score."""
    async with (
        JetStreamPlane(secured_broker.config("rollout")) as worker,
        JetStreamPlane(secured_broker.config("scorer")) as scorer_plane,
        JetStreamPlane(secured_broker.config("trainer")) as trainer,
    ):
        group = prompt_group("g-1", 12, 34, generations=2)
        await MessagePlane(worker, stage="rollout").publish(rollout(group, ["46", "45"]))
        async with running_scorer(MessagePlane(scorer_plane, stage="scorer")):
            (received,) = await eventually(
                lambda: MessagePlane(trainer, stage="trainer").fetch(
                    trainer.names.scored_consumer, ScoredRollout
                ),
                what="a scored rollout",
            )
        assert [s.reward for s in received.message.scores] == [1.0, 0.0]
        await received.delivery.ack()
