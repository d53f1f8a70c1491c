"""Weights that change during an episode: per-token versions across turns, and the drain that
``grpo.async_grpo.in_flight_weight_updates=false`` asks for."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from dockyard.engines.base import SamplingParams
from dockyard.environments.tools.toolbox import ToolSession
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings, EpisodeStart
from dockyard.producers.refit_gate import RefitGate
from tests.unit.producers.scripted_policy import scripted_engine

CALL = '<tool_call>{"name": "refit", "arguments": {}}</tool_call>'


class RefittingSession(ToolSession):
    """A tool during which a new weight version lands (as the follower would apply it)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({"refit"})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        await self.engine.update_weights(
            self.engine.current_version + 1, self.engine.model.state_dict()
        )
        return "ok"


def test_tokens_record_the_version_of_their_turn_and_the_oldest_is_a_model_token():
    engine, tok = scripted_engine([CALL, CALL, "done"])
    settings = EpisodeSettings(
        max_turns=3,
        tool_call_format="hermes",
        max_tool_calls_per_turn=1,
        max_total_sequence_length=512,
    )
    runner = EpisodeRunner(engine, SamplingParams(max_new_tokens=64), settings, tok)
    prompt = tok.encode("go", add_special_tokens=False)

    async def run():
        return await runner.run([EpisodeStart("e", prompt, RefittingSession(engine))])

    [episode] = asyncio.run(run())
    by_segment = [(s.role, set(episode.versions[s.start : s.end])) for s in episode.segments]
    # Observations carry the version of the model token before them (never an older one).
    assert by_segment == [
        ("assistant", {0}),
        ("tool", {0}),
        ("assistant", {1}),
        ("tool", {1}),
        ("assistant", {2}),
    ]
    model_versions = [v for v, m in zip(episode.versions, episode.loss_mask, strict=True) if m]
    assert min(episode.versions) == min(model_versions) == 0


async def test_without_in_flight_updates_a_refit_waits_for_the_episodes_in_hand():
    gate = RefitGate(in_flight_weight_updates=False)
    applied = asyncio.Event()

    async def refit():
        async with gate.refit():
            applied.set()

    async with gate.episodes():
        task = asyncio.create_task(refit())
        await gate.refit_waiting.wait()  # the refit is parked on the running episodes
        assert not applied.is_set()
    await task
    assert applied.is_set()


async def test_with_in_flight_updates_a_refit_lands_while_episodes_run():
    gate = RefitGate(in_flight_weight_updates=True)
    async with gate.episodes(), gate.refit():
        landed = True
    assert landed and not gate.refit_waiting.is_set()
