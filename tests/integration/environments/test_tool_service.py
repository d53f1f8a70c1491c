"""Tools as a service over a real nats-server (nats-py ``micro``): an episode calls the
calculator served on another connection, errors come back typed, the service is discoverable,
and a service that dies mid-episode fails the episode instead of hanging it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import nats
import pytest

from dockyard.engines.base import SamplingParams
from dockyard.environments.tools.calculator import CalculatorSession, CalculatorToolbox
from dockyard.environments.tools.calls import ParsedCall
from dockyard.environments.tools.service import RemoteToolbox, ToolService
from dockyard.environments.tools.toolbox import (
    Toolbox,
    ToolFailure,
    ToolLimits,
    ToolServiceUnavailable,
    ToolSession,
    run_tool_call,
)
from dockyard.producers.episodes import EpisodeRunner, EpisodeSettings, EpisodeStart
from dockyard.schemas import FinishReason
from tests.unit.producers.scripted_policy import scripted_engine

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>'


def runner_for(turns: list[str]) -> tuple[EpisodeRunner, object]:
    engine, tok = scripted_engine(turns)
    settings = EpisodeSettings(
        max_turns=4,
        tool_call_format="hermes",
        max_tool_calls_per_turn=2,
        max_total_sequence_length=512,
    )
    return EpisodeRunner(engine, SamplingParams(max_new_tokens=128), settings, tok), tok


async def test_an_episode_calls_a_served_toolbox(nats_server):
    server_nc, client_nc = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    service = await ToolService(server_nc, CalculatorToolbox()).start()
    try:
        runner, tok = runner_for([CALC, "The answer is 42."])
        session = await RemoteToolbox(client_nc, "calculator").open_session("g:0:d1:s0")
        prompt = tok.encode("what is 12+30?", add_special_tokens=False)
        [episode] = await runner.run([EpisodeStart("g:0:d1:s0", prompt, session)])
        assert [c.result for c in episode.tool_calls] == ["42"]
        assert episode.finish_reason is FinishReason.STOP

        # A refused argument reads the same over the service as in-process.
        bad = ParsedCall("calculator", '{"expression": "1//0"}', {"expression": "1//0"})
        outcome = await run_tool_call(session, bad, ToolLimits())
        assert outcome == await run_tool_call(CalculatorSession(), bad, ToolLimits())
        assert outcome.failure is ToolFailure.BAD_ARGUMENTS

        info = json.loads((await client_nc.request("$SRV.INFO.dockyard-tools", b"")).data)
        assert info["metadata"] == {"toolbox": "calculator"}
        await session.aclose()
        assert service.sessions == {}
    finally:
        await service.stop()
        await server_nc.close()
        await client_nc.close()


class DyingSession(ToolSession):
    """Its service's connection dies during the episode's second call (a crashed process)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self.calls = 0

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset({"calculator"})

    async def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        self.calls += 1
        if self.calls == 2:
            await self.connection.close()  # no reply will ever come from here
            await asyncio.Event().wait()
        return "42"


class DyingToolbox(Toolbox):
    name = "calculator"

    def __init__(self, connection) -> None:
        self.connection = connection

    async def open_session(self, episode_id: str, task: Mapping[str, Any]) -> ToolSession:
        return DyingSession(self.connection)


async def test_a_service_that_dies_mid_episode_fails_the_episode(nats_server):
    server_nc, client_nc = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    service = await ToolService(server_nc, DyingToolbox(server_nc)).start()
    try:
        runner, tok = runner_for([CALC, CALC, "never"])
        remote = RemoteToolbox(client_nc, "calculator", request_timeout_s=2.0)
        session = await remote.open_session("g:0:d1:s0")
        prompt = tok.encode("what is 12+30?", add_special_tokens=False)
        [episode] = await runner.run([EpisodeStart("g:0:d1:s0", prompt, session)])
        assert episode.finish_reason is FinishReason.ERROR
        assert episode.failure.startswith("tool service unavailable")
        assert [c.result for c in episode.tool_calls] == ["42"]  # the first call went through
        # A new episode finds no responder: nothing of the dead instance answers.
        try:
            await remote.open_session("g:0:d2:s0")
            raise AssertionError("opened a session on a dead service")
        except ToolServiceUnavailable:
            pass
    finally:
        await client_nc.close()
        if not server_nc.is_closed:
            await service.stop()
            await server_nc.close()


async def test_a_served_terminal_toolbox_gets_its_task_and_refuses_a_broken_one(nats_server):
    # The task (the group's extra) travels with the open request: the served terminal runs the
    # setup in its own sandbox, and a setup that fails comes back as TaskRefused (422), not as
    # a lost service, so the worker dead-letters the group instead of replaying it.
    from dockyard.config.sections.env import SandboxLimits, TerminalBenchEnvConfig
    from dockyard.environments.tools.terminal import TerminalToolbox
    from dockyard.environments.tools.toolbox import TaskRefused

    settings = TerminalBenchEnvConfig(limits=SandboxLimits(wall_time_s=5.0))
    server_nc, client_nc = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    service = await ToolService(server_nc, TerminalToolbox(settings)).start()
    remote = RemoteToolbox(client_nc, "terminal_bench")
    try:
        session = await remote.open_session("g:0:d1:s0", {"setup": "echo ready > state"})
        call = ParsedCall("bash", '{"command": "cat state"}', {"command": "cat state"})
        outcome = await run_tool_call(session, call, ToolLimits())
        assert outcome.text == "ready\n[exit 0]"
        await session.aclose()
        assert service.sessions == {}  # closed on the service: its sandbox is gone
        with pytest.raises(TaskRefused, match="exit 4") as refused:
            await remote.open_session("g:0:d1:s1", {"setup": "exit 4"})
        assert refused.value.reason == "setup_failed"
    finally:
        await service.stop()
        await server_nc.close()
        await client_nc.close()


@pytest.mark.parametrize("kind", ["a11y_tree", "screenshot"])
async def test_a_served_desktop_answers_its_text_and_refuses_to_drop_a_screenshot(
    nats_server, kind
):
    # The service's reply is the tool's text: the tree travels; a screenshot cannot, so the
    # call is answered with an error that says so (never the text without its image).
    import json as _json
    from pathlib import Path

    from dockyard.config.sections.env import OsworldEnvConfig
    from dockyard.environments.tools.desktop import DesktopToolbox
    from tests.osworld_simulator import simulator_command
    from tests.sandbox_service import sandbox_service

    data = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "osworld.jsonl"
    task = _json.loads(data.read_text().splitlines()[0])["task"]
    with sandbox_service(simulator_command()) as url:
        toolbox = DesktopToolbox(OsworldEnvConfig(simulator_url=url, observation_type=kind))
        server_nc = await nats.connect(nats_server.url)
        client_nc = await nats.connect(nats_server.url)
        service = await ToolService(server_nc, toolbox).start()
        remote = RemoteToolbox(client_nc, "osworld")
        try:
            session = await remote.open_session("g:0:d1:s0", {"task": task})
            arguments = {"action": "pyautogui.click(20, 20)"}
            call = ParsedCall("computer", _json.dumps(arguments), arguments)
            outcome = await run_tool_call(session, call, ToolLimits())
            await session.aclose()
        finally:
            await service.stop()
            await toolbox.aclose()
            await server_nc.close()
            await client_nc.close()
    if kind == "a11y_tree":
        assert (outcome.failure, outcome.images) == (None, ())
        assert "entry\tName\t" in outcome.text
    else:
        assert outcome.failure is ToolFailure.RAISED
        assert "answered with images, which a tool service cannot carry" in outcome.text
