"""The rollout worker against a real nats-server: prompt group in → rollout out, generated with
the published weights; a refit whose blob is corrupt is refused and the old weights stay."""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
import numpy as np
import pytest
import torch

from dockyard.broker.jetstream import JetStreamPlane
from dockyard.broker.typed import MessagePlane
from dockyard.broker.weight_blobs.factory import create_weight_store
from dockyard.engines.base import EngineError
from dockyard.engines.sampling import make_sampling_params
from dockyard.engines.torch_engine import TorchEngine
from dockyard.models import build_arithmetic_policy
from dockyard.observability.status_files import STARTING, StatusFile, read_statuses
from dockyard.producers.rollout_worker import RolloutWorker
from dockyard.schemas import EngineInfo, Rollout, WeightVersion, decode
from tests.integration.roles.factories import prompt_group


async def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def publish_weights(messages, store, version: int, state, before_event=None):
    ref = await store.put(version, {k: v.clone().contiguous() for k, v in state.items()})
    if before_event is not None:
        before_event(ref)
    event = WeightVersion(
        version=version,
        step=version,
        blob_ref=ref.uri,
        digest=ref.digest,
        nbytes=ref.nbytes,
        created_at_unix_s=time.time(),
        producer_id="test-trainer",
    )
    await messages.publish(event)
    return event


def engine_over(model, tokenizer, engine_class=TorchEngine):
    return engine_class(
        model, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )


@contextlib.asynccontextmanager
async def with_weights(config, state_dict):
    """A started plane, its typed layer and weight store, with ``state_dict`` as version 0."""
    async with JetStreamPlane(config) as plane:
        messages = MessagePlane(plane, stage="test")
        store = create_weight_store(plane)
        await publish_weights(messages, store, 0, state_dict)
        yield plane, messages, store


def make_worker(plane, store, engine, **options) -> RolloutWorker:
    return RolloutWorker(
        MessagePlane(plane, stage="rollout"),
        store,
        engine,
        make_sampling_params(max_new_tokens=4, temperature=1.0, seed=0),
        worker_id="w-test",
        engine_info=EngineInfo(name="torch", version="test"),
        **options,
    )


@contextlib.asynccontextmanager
async def running_worker(plane, store, engine, **options):
    worker = make_worker(plane, store, engine, **options)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)


async def rollouts(plane) -> list[Rollout]:
    return [
        decode(m.headers, m.data, expected=Rollout)
        async for m in plane.replay(plane.names.rollouts)
    ]


async def test_prompt_group_in_rollout_out_with_the_published_weights(data_plane_config):
    trained, tokenizer = build_arithmetic_policy(seed=1)
    engine_model, _ = build_arithmetic_policy(seed=0)  # different initial weights
    engine = engine_over(engine_model, tokenizer)
    async with with_weights(data_plane_config, trained.state_dict()) as (plane, messages, store):
        await messages.publish(prompt_group("g-1", generations=3))
        async with running_worker(plane, store, engine) as worker:
            await wait_for(lambda: _has_rollouts(plane, 1))
            assert worker.refits == 1
        (rollout,) = await rollouts(plane)
        assert rollout.group_id == "g-1" and len(rollout.samples) == 3
        for sample in rollout.samples:
            assert (sample.token_weight_versions == 0).all()
            assert np.isfinite(sample.behaviour_logprobs).all()
        # The engine now holds the published weights, not its initial ones.
        for name, tensor in trained.state_dict().items():
            assert torch.equal(engine.model.state_dict()[name], tensor)
        assert (await plane.consumer_lag(plane.names.prompt_consumer)).backlog == 0


async def test_a_corrupt_blob_is_refused_and_the_old_weights_stay(
    data_plane_config_factory, nats_server, tmp_path
):
    config = data_plane_config_factory(
        nats_server.url, weight_transport={"kind": "filesystem", "path": str(tmp_path / "blobs")}
    )
    good, tokenizer = build_arithmetic_policy(seed=1)
    other, _ = build_arithmetic_policy(seed=2)
    engine = engine_over(build_arithmetic_policy(seed=0)[0], tokenizer)
    async with with_weights(config, good.state_dict()) as (plane, messages, store):
        async with running_worker(plane, store, engine) as worker:
            await wait_for(lambda: _refits(worker, 1))

            # Version 1's bytes are damaged on the shared filesystem before its event goes out.
            def corrupt(ref) -> None:
                blob = next(
                    p
                    for p in (tmp_path / "blobs").rglob("*")
                    if ref.hex in p.name and p.is_file() and p.stat().st_size > 1000
                )
                data = bytearray(blob.read_bytes())
                data[len(data) // 2] ^= 0xFF
                blob.write_bytes(bytes(data))

            await publish_weights(messages, store, 1, other.state_dict(), before_event=corrupt)
            await wait_for(lambda: _refused(worker, 1))
            assert engine.current_version == 0
            await messages.publish(prompt_group("g-after"))
            await wait_for(lambda: _has_rollouts(plane, 1))
        (rollout,) = await rollouts(plane)
        assert all((s.token_weight_versions == 0).all() for s in rollout.samples)
        for name, tensor in good.state_dict().items():
            assert torch.equal(engine.model.state_dict()[name], tensor)


class RefitFailsOnceEngine(TorchEngine):
    """A stand-in engine (named as such) whose first refit after the initial weights fails,
    as a real engine's can (out of memory, a server restarting)."""

    failures_left = 1

    async def update_weights(self, version, source):
        if version > 0 and self.failures_left:
            self.failures_left -= 1
            raise EngineError("refit failed for the test")
        await super().update_weights(version, source)


async def test_a_failed_refit_keeps_the_old_weights_and_the_next_version_is_applied(
    data_plane_config,
):
    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(build_arithmetic_policy(seed=3)[0], tokenizer, RefitFailsOnceEngine)
    async with with_weights(data_plane_config, model.state_dict()) as (plane, messages, store):
        async with running_worker(plane, store, engine) as worker:
            await wait_for(lambda: _refits(worker, 1))
            await publish_weights(messages, store, 1, model.state_dict())
            await wait_for(lambda: _failed_refits(worker, 1))
            assert engine.current_version == 0
            await publish_weights(messages, store, 2, model.state_dict())
            await wait_for(lambda: _refits(worker, 2))  # the follower lived on
        assert engine.current_version == 2


async def _failed_refits(worker, count: int) -> bool:
    return worker.failed_refits >= count


async def _has_rollouts(plane, count: int) -> bool:
    return len(await rollouts(plane)) >= count


async def _refits(worker, count: int) -> bool:
    return worker.refits >= count


async def _refused(worker, count: int) -> bool:
    return worker.refused_refits >= count


class FailingEngine(TorchEngine):
    """A stand-in engine (named as such) whose every generate call fails, as a crashed
    inference server would: it exercises the worker's error path."""

    async def generate(self, requests, params, num_samples):
        raise RuntimeError("engine crashed")


async def test_engine_failures_nak_the_work_and_make_the_worker_unhealthy(data_plane_config):
    from dockyard.producers.rollout_worker import WorkerUnhealthy

    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(model, tokenizer, FailingEngine)
    async with with_weights(data_plane_config, model.state_dict()) as (plane, messages, store):
        await messages.publish(prompt_group("g-retry"))
        worker = make_worker(plane, store, engine, nak_delay_s=0.1, max_consecutive_failures=2)
        try:
            await asyncio.wait_for(worker.run(), 60)
            raise AssertionError("the worker should have given up")
        except WorkerUnhealthy as error:
            assert "2 consecutive engine failures" in str(error)
        assert worker.failures == 2
        # Nothing was lost: the group is still there for a healthy worker.
        healthy = engine_over(model, tokenizer)
        async with running_worker(plane, store, healthy):
            await wait_for(lambda: _has_rollouts(plane, 1))
        assert (await rollouts(plane))[0].group_id == "g-retry"


async def test_a_failed_batch_naks_only_what_is_not_settled_yet(data_plane_config):
    from dockyard.producers.multimodal import MultimodalLimits
    from dockyard.producers.rollout_worker import WorkerUnhealthy

    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(model, tokenizer, FailingEngine)
    async with with_weights(data_plane_config, model.state_dict()) as (plane, messages, store):
        # One batch: a group refused at the boundary (dead-lettered, settled) and one the
        # engine fails on. Only the second may be nak'ed: JetStream refuses a second settle.
        with_image = msgspec.structs.replace(prompt_group("g-image"), **{"images": [png_bytes()]})
        await messages.publish_many([with_image, prompt_group("g-text")])
        worker = make_worker(
            plane,
            store,
            engine,
            nak_delay_s=0.1,
            max_consecutive_failures=1,
            multimodal=MultimodalLimits(allow_multimodal_inputs=False),
        )
        with pytest.raises(WorkerUnhealthy, match="1 consecutive engine failures"):
            await asyncio.wait_for(worker.run(), 60)
        assert worker.refused_groups == 1
        [again] = await plane.fetch(plane.names.prompt_consumer, timeout_s=10)
        group = decode(again.headers, again.data)
        assert group.group_id == "g-text" and again.num_delivered == 2
        await again.ack()


@pytest.mark.slow
async def test_generation_longer_than_the_ack_wait_is_not_given_to_another_worker(
    data_plane_config,
):
    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(model, tokenizer)
    async with with_weights(data_plane_config, model.state_dict()) as (plane, messages, store):
        await messages.publish(prompt_group("g-long"))
        # 4 tokens at a simulated 1 s each: a batch takes 4 ack waits of 1 s.
        slow = {"simulated_latency_per_token_s": data_plane_config.consumer.ack_wait_s}
        async with (
            running_worker(plane, store, engine, **slow) as first,
            running_worker(plane, store, engine, **slow) as second,
        ):
            await wait_for(lambda: _has_rollouts(plane, 1))
        assert first.groups_done + second.groups_done == 1  # generated once, by one worker


class PoisonSensitiveEngine(TorchEngine):
    """A stand-in engine (named as such) that fails any batch holding group ``g-poison``, as an
    engine can on one malformed prompt."""

    async def generate(self, requests, params, num_samples):
        if any(request.request_id == "g-poison" for request in requests):
            raise RuntimeError("engine choked on one prompt")
        return await super().generate(requests, params, num_samples)


async def test_one_poison_prompt_does_not_take_its_batch_down_with_it(data_plane_config):
    from dockyard.schemas import DeadLetter

    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(model, tokenizer, PoisonSensitiveEngine)
    # The test config's max_deliver is 3.
    async with with_weights(data_plane_config, model.state_dict()) as (plane, messages, store):
        await messages.publish_many([prompt_group(g) for g in ("g-ok-1", "g-poison", "g-ok-2")])
        # Three failures in a row make a worker unhealthy: the poison alone, redelivered twice
        # after its batch went through, fails twice and is then a dead letter.
        async with running_worker(
            plane, store, engine, nak_delay_s=0.05, max_consecutive_failures=3
        ) as worker:
            await wait_for(lambda: _has_rollouts(plane, 2))
            await wait_for(lambda: _dead_letters(plane, 1))
            assert worker.groups_done == 2  # the healthy worker was never declared unhealthy
        assert sorted(r.group_id for r in await rollouts(plane)) == ["g-ok-1", "g-ok-2"]
        [dead] = [m async for m in plane.replay(plane.names.dead_letters)]
        letter = decode(dead.headers, dead.data, expected=DeadLetter)
        assert letter.reason == "engine_error" and letter.stage == "rollout"
        assert "choked" in letter.message and letter.delivery_count == 3


async def _dead_letters(plane, count: int) -> bool:
    return len([m async for m in plane.replay(plane.names.dead_letters)]) >= count


def png_bytes() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGBA", (8, 8), (255, 0, 0, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_images_are_gated_at_the_worker_boundary(data_plane_config):
    from dockyard.producers.multimodal import MultimodalLimits
    from dockyard.schemas import DeadLetter

    model, tokenizer = build_arithmetic_policy(seed=0)
    engine = engine_over(model, tokenizer)
    async with with_weights(data_plane_config, model.state_dict()) as (plane, messages, store):
        with_image = msgspec.structs.replace(prompt_group("g-image"), **{"images": [png_bytes()]})
        await messages.publish(with_image)
        await messages.publish(prompt_group("g-text"))
        for allow, reason in (
            (False, "multimodal_disabled"),
            (True, "images_unsupported_by_backend"),
        ):
            limits = MultimodalLimits(allow_multimodal_inputs=allow)
            async with running_worker(plane, store, engine, multimodal=limits) as worker:
                await wait_for(lambda w=worker: _refused_groups(w, 1))
            dead = [m async for m in plane.replay(plane.names.dead_letters)]
            letter = decode(dead[-1].headers, dead[-1].data, expected=DeadLetter)
            assert letter.reason == reason and letter.stage == "rollout"
            # Re-queue the refused group for the second configuration.
            await messages.publish(msgspec.structs.replace(with_image, **{"attempt": 1}))
        # The text group went through untouched.
        assert [r.group_id for r in await rollouts(plane)] == ["g-text"]


async def _refused_groups(worker, count: int) -> bool:
    return worker.refused_groups >= count


async def test_a_worker_stopped_before_any_weights_leaves_no_waiter_behind(data_plane_config):
    # Waiting for its first weights, the worker waits on two events; stopped then, it must not
    # leave the other waiter pending (a loop that made new waiters each second leaked them).
    def event_waiters() -> set[asyncio.Task]:
        return {
            task
            for task in asyncio.all_tasks()
            if not task.done() and task.get_coro().__qualname__ == "Event.wait"
        }

    model, tokenizer = build_arithmetic_policy(seed=0)
    async with JetStreamPlane(data_plane_config) as plane:
        store = create_weight_store(plane)
        before = event_waiters()
        worker = make_worker(plane, store, engine_over(model, tokenizer))
        running = asyncio.create_task(worker.run())

        async def waiting_for_weights() -> bool:
            return len(event_waiters() - before) >= 2

        await wait_for(waiting_for_weights)
        assert not worker.weights_ready.is_set()
        worker.stop()
        await asyncio.wait_for(running, 20)
        await asyncio.sleep(0)  # one turn of the loop: cancelled waiters finish
        assert event_waiters() - before == set()


async def test_a_worker_reports_itself_starting_until_its_first_weights_are_loaded(
    data_plane_config, tmp_path
):
    # The trainer counts starvation only once the workers it waits for are ready: a worker
    # without weights cannot take work, whatever its process is doing.
    model, tokenizer = build_arithmetic_policy(seed=0)

    async def state() -> str:
        (status,) = read_statuses(tmp_path)
        return status.state

    async with JetStreamPlane(data_plane_config) as plane:
        messages = MessagePlane(plane, stage="test")
        store = create_weight_store(plane)
        status = StatusFile(tmp_path, "rollout", "w-test")
        engine = engine_over(model, tokenizer)
        async with running_worker(plane, store, engine, status=status) as worker:

            async def waiting_for_weights() -> bool:
                return tmp_path.joinpath("rollout-w-test.json").exists()

            await wait_for(waiting_for_weights)
            assert await state() == STARTING
            await publish_weights(messages, store, 0, model.state_dict())

            async def ready() -> bool:
                return await state() == "running"

            await wait_for(ready)
            assert worker.refits == 1
