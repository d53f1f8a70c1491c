"""The rollout worker following a chain of weight patches over a real nats-server: it loads
each version bit-identically into its torch engine, refuses a patch whose result is not what it
claims (keeping the weights it had), and goes on with the next genuine version."""

from __future__ import annotations

import time

import torch

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.chain import ChainPublisher, PublishedBlob
from dockyard.broker.weight_blobs.factory import create_weight_store
from dockyard.broker.weight_blobs.patch import (
    PATCH_FORMAT,
    ChainLink,
    PatchHeader,
    encode_patch,
    state_digest,
)
from dockyard.models import build_arithmetic_policy
from dockyard.schemas import WeightVersion
from tests.integration.roles.test_rollout_worker import (
    _refused,
    engine_over,
    running_worker,
    wait_for,
)


def _event(version: int, blob: PublishedBlob) -> WeightVersion:
    return WeightVersion(
        version=version,
        step=version,
        blob_ref=blob.ref.uri,
        digest=blob.ref.digest,
        nbytes=blob.ref.nbytes,
        format=blob.format,
        delta_base_version=blob.delta_base_version,
        created_at_unix_s=time.time(),
        producer_id="test-trainer",
    )


def _versions(model: torch.nn.Module, count: int) -> list[dict[str, torch.Tensor]]:
    """bf16 weights of ``count`` small steps: a few elements change from one to the next."""
    master = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = []
    for step in range(count):
        out.append({k: v.to(torch.bfloat16) for k, v in master.items()})
        for tensor in master.values():
            tensor.view(-1)[step::97] += 0.05
    return out


def _engine_holds(engine, state: dict[str, torch.Tensor]) -> bool:
    loaded = engine.model.state_dict()
    return all(
        torch.equal(loaded[k].view(torch.int16), v.view(torch.int16)) for k, v in state.items()
    )


async def test_a_worker_refits_from_patches_and_refuses_a_forged_one(
    data_plane_config_factory, nats_server
):
    config = data_plane_config_factory(
        nats_server.url, weight_transport={"patches": {"enabled": True, "snapshot_every": 10}}
    )
    policy, tokenizer = build_arithmetic_policy(seed=1)
    states = _versions(policy, 4)
    engine_model, _ = build_arithmetic_policy(seed=0, dtype=torch.bfloat16)
    engine = engine_over(engine_model, tokenizer)
    async with JetStreamPlane(config) as plane:
        messages = MessagePlane(plane, stage="test")
        store = create_weight_store(plane)
        publisher = ChainPublisher(store, enabled=True, snapshot_every=10)
        events = [_event(0, await publisher.publish(0, states[0]))]
        async with running_worker(plane, create_weight_store(plane, reader_id="w"), engine) as w:
            await messages.publish(events[0])
            await wait_for(lambda: _at(engine, 0))
            events.append(_event(1, await publisher.publish(1, states[1])))
            assert events[1].format == PATCH_FORMAT
            await messages.publish(events[1])
            await wait_for(lambda: _at(engine, 1))
            assert _engine_holds(engine, states[1])

            # A forged v2: addressed correctly, but its elements do not make what it names.
            tampered = {k: v.clone() for k, v in states[2].items()}
            next(iter(tampered.values())).view(-1)[0] += 1.0
            header = PatchHeader(
                version=2,
                base_version=1,
                base_digest=state_digest(states[1]),
                result_digest=state_digest(states[2]),
                snapshot=ChainLink(0, events[0].digest, events[0].nbytes),
                chain=(ChainLink(1, events[1].digest, events[1].nbytes),),
            )
            blob, _ = encode_patch(states[1], tampered, header)
            forged = _event(2, PublishedBlob(await store.put(2, blob), PATCH_FORMAT, 1, None))
            await messages.publish(forged)
            await wait_for(lambda: _refused(w, 1))
            assert engine.current_version == 1 and _engine_holds(engine, states[1])

            # The genuine v3 is a patch on v2, which the worker never loaded: it catches up.
            await publisher.publish(2, states[2])
            events.append(_event(3, await publisher.publish(3, states[3])))
            await messages.publish(events[-1])
            await wait_for(lambda: _at(engine, 3))
            assert _engine_holds(engine, states[3])
            assert w.weight_chain.catch_ups == 1


async def _at(engine, version: int) -> bool:
    return engine.current_version == version
