"""InProcessFleet: the run ends with the main role, a failing role ends it naming the role, a
stop request drains every role. The roles here are small coroutines that behave as the real
ones do: run until their ``stop`` is called (the pipeline's roles are tested end to end in
tests/integration/e2e/test_in_process.py)."""

from __future__ import annotations

import asyncio

import pytest

from dockyard.fleet.inprocess import InProcessFleet, RoleFailed, RoleTask


class Role:
    """Runs until stopped (then returns ``result``), or raises ``error`` once ``fail`` is set."""

    def __init__(self, name: str, result: object = None) -> None:
        self.name = name
        self.result = result
        self.stopping = asyncio.Event()
        self.fail = asyncio.Event()
        self.finished = False

    async def run(self) -> object:
        waiters = [asyncio.ensure_future(e.wait()) for e in (self.stopping, self.fail)]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if self.fail.is_set():
            raise RuntimeError(f"{self.name} broke")
        self.finished = True
        return self.result

    def task(self) -> RoleTask:
        return RoleTask(self.name, self.run, self.stopping.set)


async def test_the_run_ends_with_the_main_role_and_stops_the_others() -> None:
    main, helpers = Role("trainer-0", result="summary"), [Role("rollout-0"), Role("scorer-0")]
    fleet = InProcessFleet(main.task(), [h.task() for h in helpers])
    asyncio.get_running_loop().call_soon(main.stopping.set)  # the trainer reaches its end
    assert await fleet.run(lambda: None, tick_s=60) == "summary"
    assert all(h.finished for h in helpers)
    assert not fleet.stop_requested


async def test_a_helper_that_fails_ends_the_run_naming_it() -> None:
    main, worker, scorer = Role("trainer-0"), Role("rollout-0"), Role("scorer-0")
    fleet = InProcessFleet(main.task(), [worker.task(), scorer.task()])
    asyncio.get_running_loop().call_soon(worker.fail.set)
    with pytest.raises(RoleFailed, match=r"^rollout-0 failed: RuntimeError: rollout-0 broke$"):
        await fleet.run(lambda: None, tick_s=60)
    assert main.finished and scorer.finished  # asked to drain, not abandoned


async def test_a_helper_that_returns_while_the_run_needs_it_is_a_failure() -> None:
    main, scorer = Role("trainer-0"), Role("scorer-0")
    fleet = InProcessFleet(main.task(), [scorer.task()])
    asyncio.get_running_loop().call_soon(scorer.stopping.set)  # not a stop of the run
    with pytest.raises(RoleFailed, match="scorer-0 failed: it exited early"):
        await fleet.run(lambda: None, tick_s=60)


async def test_a_failing_main_role_is_named() -> None:
    main, worker = Role("trainer-0"), Role("rollout-0")
    fleet = InProcessFleet(main.task(), [worker.task()])
    asyncio.get_running_loop().call_soon(main.fail.set)
    with pytest.raises(RoleFailed) as failure:
        await fleet.run(lambda: None, tick_s=60)
    assert failure.value.name == "trainer-0"
    assert isinstance(failure.value.error, RuntimeError)
    assert worker.finished


async def test_a_stop_request_drains_every_role() -> None:
    main, worker = Role("trainer-0", result="summary"), Role("rollout-0")
    fleet = InProcessFleet(main.task(), [worker.task()])
    asyncio.get_running_loop().call_soon(fleet.request_stop)
    assert await fleet.run(lambda: None, tick_s=60) == "summary"
    assert fleet.stop_requested and worker.finished


async def test_a_role_that_does_not_drain_is_cancelled_after_the_drain_time() -> None:
    main = Role("trainer-0", result="summary")
    stuck_cancelled = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.Event().wait()  # ignores its stop
        except asyncio.CancelledError:
            stuck_cancelled.set()
            raise

    fleet = InProcessFleet(
        main.task(), [RoleTask("scorer-0", stuck, lambda: None)], drain_timeout_s=0.05
    )
    asyncio.get_running_loop().call_soon(main.stopping.set)
    assert await fleet.run(lambda: None, tick_s=60) == "summary"
    assert stuck_cancelled.is_set()


async def test_the_display_is_refreshed_while_the_roles_run() -> None:
    main = Role("trainer-0")
    fleet = InProcessFleet(main.task(), [])
    ticks: list[int] = []

    def on_tick() -> None:
        ticks.append(1)
        if len(ticks) == 3:
            main.stopping.set()

    await fleet.run(on_tick, tick_s=0.01)
    assert len(ticks) >= 3
