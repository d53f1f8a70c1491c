"""The multi-turn terminal_bench toolbox with real sandboxed commands (bubblewrap, cgroups and
tmpfs work directories as this machine gives them), and the scorer's replay of an episode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dockyard.config.sections.env import EnvConfig, SandboxLimits, TerminalBenchEnvConfig
from dockyard.environments import EnvironmentContext, SampleInput, ScoringGroup, build_environment
from dockyard.environments.base import ToolCallRecord
from dockyard.environments.tools.calls import ParsedCall
from dockyard.environments.tools.terminal import TerminalToolbox
from dockyard.environments.tools.toolbox import (
    TaskRefused,
    ToolFailure,
    ToolLimits,
    run_tool_call,
    toolbox_class,
)

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "terminal_bench.jsonl"
TASKS = {r["id"]: r for r in map(json.loads, DATA.read_text().splitlines())}
LIMITS = SandboxLimits(wall_time_s=3.0, cpu_time_s=2.0, max_output_bytes=10_000)
SETTINGS = TerminalBenchEnvConfig(limits=LIMITS)


def call(arguments: dict) -> ParsedCall:
    return ParsedCall(name="bash", arguments_json=json.dumps(arguments), arguments=arguments)


def bash(command: object) -> ParsedCall:
    return call({"command": command})


async def run_calls(commands, task=None, limits: ToolLimits | None = None):
    """The observations of ``commands`` run one after the other in one episode's session."""
    toolbox = TerminalToolbox(SETTINGS)
    session = await toolbox.open_session("g:0:d1:s0", task or {})
    try:
        return [await run_tool_call(session, bash(c), limits or ToolLimits()) for c in commands]
    finally:
        await session.aclose()


def test_the_terminal_toolbox_is_the_terminal_bench_environments():
    env = EnvConfig(terminal_bench=SETTINGS)
    toolbox = toolbox_class("terminal_bench").from_env_config(env)
    assert isinstance(toolbox, TerminalToolbox)
    assert toolbox.settings.limits.wall_time_s == 3.0  # env.terminal_bench.limits


def test_setup_runs_first_and_files_persist_between_calls_but_shell_state_does_not():
    task = TASKS["tb-3"]  # setup writes data.csv with three lines
    outcomes = asyncio.run(
        run_calls(["wc -l < data.csv > count.txt", "cat count.txt; cd /; pwd", "pwd"], task)
    )
    assert [o.failure for o in outcomes] == [None, None, None]
    assert outcomes[0].text == "[exit 0]"
    assert outcomes[1].text == "3\n/\n[exit 0]"
    assert outcomes[2].text.endswith("[exit 0]") and outcomes[2].text != "/\n[exit 0]"


def test_stderr_and_the_exit_status_are_what_the_model_reads():
    [outcome] = asyncio.run(run_calls(["echo out; echo err >&2; exit 3"]))
    assert outcome.text == "out\nerr\n[exit 3]"


def test_a_command_that_hangs_is_killed_and_the_session_goes_on():
    # Past the sandbox's wall clock (3 s): killed, the model reads so.
    first, after = asyncio.run(run_calls(["sleep 600", "echo still here"]))
    assert first.text.endswith("[killed: over the 3s limit]")
    assert after.text == "still here\n[exit 0]"


def test_a_call_the_episode_gives_up_on_is_killed_before_the_next_runs():
    # The episode's own timeout strikes first: the call's process tree is killed (the next
    # command would wait behind it otherwise) and the model reads the timeout.
    limits = ToolLimits(timeout_s=0.5)
    first, after = asyncio.run(run_calls(["touch began; sleep 600", "ls"], limits=limits))
    assert first.failure is ToolFailure.TIMEOUT
    assert after.text == "began\n[exit 0]"


def test_a_command_that_floods_its_output_is_cut_at_the_sandbox_limit():
    [outcome] = asyncio.run(run_calls(["yes | head -c 5000000"]))
    assert outcome.failure is None
    assert outcome.text.endswith("\n[output over 10000 bytes: cut, killed]")
    assert outcome.text.startswith("y\n" * 100)
    assert len(outcome.text.encode()) <= 10_000 + 100


def test_bytes_that_are_not_utf8_reach_the_model_escaped():
    [outcome] = asyncio.run(run_calls(["printf 'a\\377b'"]))
    assert outcome.text == "a\\xffb\n[exit 0]"


def test_commands_cannot_write_outside_their_work_directory(tmp_path):
    outside = tmp_path / "escaped"
    commands = [
        f"echo pwned > {outside}",
        "echo pwned > /etc/dockyard-pwned",
        "mkdir -p ../up && echo pwned > ../up/x",
        f"ln -s {tmp_path} link && echo pwned > link/escaped2",
    ]
    outcomes = asyncio.run(run_calls(commands))
    # Whatever each command managed inside the sandbox, nothing reached the host.
    assert not outside.exists() and not (tmp_path / "escaped2").exists()
    assert not Path("/etc/dockyard-pwned").exists()
    assert not outcomes[1].text.endswith("[exit 0]")  # / is read-only


def test_episodes_do_not_share_a_work_directory():
    async def two_sessions():
        toolbox = TerminalToolbox(SETTINGS)
        first = await toolbox.open_session("g:0:d1:s0", {})
        second = await toolbox.open_session("g:0:d1:s1", {})
        try:
            await run_tool_call(first, bash("echo mine > note"), ToolLimits())
            return await run_tool_call(second, bash("cat note"), ToolLimits())
        finally:
            await first.aclose()
            await second.aclose()

    outcome = asyncio.run(two_sessions())
    assert outcome.text.endswith("[exit 1]") and "No such file" in outcome.text


def test_arguments_other_than_one_command_are_refused_to_the_model():
    async def refused():
        session = await TerminalToolbox(SETTINGS).open_session("e", {})
        try:
            calls = [
                bash(""),
                bash(["ls"]),
                call({"command": "ls", "cwd": "/"}),
                bash("x" * (SETTINGS.max_script_chars + 1)),
            ]
            return [await run_tool_call(session, call, ToolLimits()) for call in calls]
        finally:
            await session.aclose()

    assert [o.failure for o in asyncio.run(refused())] == [ToolFailure.BAD_ARGUMENTS] * 4


def test_a_setup_that_fails_refuses_the_task():
    with pytest.raises(TaskRefused) as refused:
        asyncio.run(run_calls([], {"setup": "exit 7", "check": "true"}))
    assert refused.value.reason == "setup_failed"
    with pytest.raises(TaskRefused) as refused:
        asyncio.run(run_calls([], {"setup": ["ls"], "check": "true"}))
    assert refused.value.reason == "bad_setup_script"


def test_a_wall_clock_over_the_tool_timeout_is_refused():
    slow = TerminalBenchEnvConfig(limits=SandboxLimits(wall_time_s=ToolLimits().timeout_s))
    with pytest.raises(ValueError, match="must be under the tool call timeout"):
        TerminalToolbox(slow)


def _record(command: str, result: str | None = "…\n[exit 0]", name: str = "bash"):
    return ToolCallRecord(name, json.dumps({"command": command}), result)


def test_the_scorer_replays_the_commands_the_tool_ran_then_checks():
    context = EnvironmentContext()
    context.env.terminal_bench = SETTINGS
    environment = build_environment("terminal_bench", context)
    task = TASKS["tb-2"]  # delete logs/*.log, keep logs/keep.txt
    episodes = [
        [_record("ls logs"), _record("rm -f logs/*.log")],  # solves it
        [_record("rm -f logs/*.log"), _record("rm logs/keep.txt")],  # solves, then breaks it
        [_record("rm -f logs/*.log", result=None)],  # recorded at the turn limit, never run
        [_record("rm -f logs/*.log", result="error: not run: at most 1 tool calls per turn")],
        [_record("rm -f logs/*.log", name="shell")],  # not the tool: nothing ran
        [ToolCallRecord("bash", '{"command": "rm -f logs/*.log", "x": 1}', "error: bash: …")],
        [],  # an episode that called nothing
    ]
    group = ScoringGroup(
        group_id="tb-2",
        env_name="terminal_bench",
        prompt_text=task["instruction"],
        # The response text would solve it as a single-turn script: an episode's is not run.
        samples=[SampleInput("rm -f logs/*.log", tool_calls=calls) for calls in episodes],
        extra={"setup": task["setup"], "check": task["check"]},
    )
    score = asyncio.run(environment.score(group))
    assert score.rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert [s.components["commands"] for s in score.samples] == [2, 2, 0, 0, 0, 0, 0]
