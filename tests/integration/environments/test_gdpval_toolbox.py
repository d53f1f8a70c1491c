"""The multi-turn gdpval toolbox (file tools, :mod:`dockyard.environments.tools.files`) with real
sandboxed runs (bubblewrap, cgroups and tmpfs work directories as this machine gives them), and
the scorer's rebuild of an episode's deliverables by replaying its calls in a fresh session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from dockyard.config.sections.env import EnvConfig, GdpvalEnvConfig, JudgeConfig, SandboxLimits
from dockyard.environments.base import ScoreFlag, ToolCallRecord
from dockyard.environments.gdpval_env import GdpvalEnvironment, GdpvalTask
from dockyard.environments.tools.calls import ParsedCall
from dockyard.environments.tools.gdpval import GdpvalToolbox
from dockyard.environments.tools.toolbox import (
    NOT_RUN_PREFIX,
    ToolFailure,
    ToolLimits,
    ToolOutcome,
    run_tool_call,
    toolbox_class,
)

LIMITS = SandboxLimits(wall_time_s=3.0, cpu_time_s=2.0, max_output_bytes=10_000)
# The judge is never called here: these tests stop at the deliverables the judge would read.
SETTINGS = GdpvalEnvConfig(limits=LIMITS, judge=JudgeConfig(base_url="http://127.0.0.1:9"))
SALES_SETUP = "printf 'month,amount\\njan,10\\nfeb,20\\n' > sales.csv"


def call(name: str, **arguments: object) -> ParsedCall:
    return ParsedCall(name=name, arguments_json=json.dumps(arguments), arguments=arguments)


async def run_calls(calls: list[ParsedCall], setup: str = "") -> list[ToolOutcome]:
    """The observations of ``calls`` run one after the other in one episode's session."""
    session = await GdpvalToolbox(SETTINGS).open_session("g:0:d1:s0", {"setup": setup})
    try:
        return [await run_tool_call(session, c, ToolLimits()) for c in calls]
    finally:
        await session.aclose()


def test_the_gdpval_toolbox_is_built_from_env_gdpval():
    toolbox = toolbox_class("gdpval").from_env_config(EnvConfig(gdpval=SETTINGS))
    assert isinstance(toolbox, GdpvalToolbox)
    assert toolbox.settings.limits.wall_time_s == 3.0
    names = [schema["function"]["name"] for schema in toolbox.tool_schemas()]
    assert names == ["bash", "write_file", "read_file", "list_files"]


def test_files_written_read_listed_and_made_by_commands_persist_in_the_episode():
    outcomes = asyncio.run(
        run_calls(
            [
                call("write_file", path="out/memo.txt", content="line one\nline two\n"),
                call("read_file", path="out/memo.txt"),
                call("read_file", path="out/memo.txt", start_line=2, end_line=2),
                call("bash", command="wc -l < out/memo.txt; echo oops >&2"),
                call("list_files"),
                call("list_files", path="out"),
            ],
            setup=SALES_SETUP,
        )
    )
    assert [o.failure for o in outcomes] == [None] * 6
    assert outcomes[0].text == "wrote 18 bytes to out/memo.txt\n"
    assert outcomes[1].text == "1  line one\n2  line two\n"
    assert outcomes[2].text == "2  line two\n"
    assert outcomes[3].text == "2\noops\n[exit 0]"
    assert outcomes[4].text == "out/\nsales.csv\n"  # the setup's file is there
    assert outcomes[5].text == "memo.txt\n"


def test_paths_outside_the_work_directory_are_refused_as_bad_arguments():
    outcomes = asyncio.run(
        run_calls(
            [
                call("read_file", path="/etc/passwd"),
                call("write_file", path="../escape.txt", content="x"),
                call("read_file", path="a.txt", start_line=3, end_line=1),
                call("write_file", path="a.txt"),  # no content
                call("list_files", path="."),
            ]
        )
    )
    assert [o.failure for o in outcomes[:4]] == [ToolFailure.BAD_ARGUMENTS] * 4
    assert "must be relative" in outcomes[0].text
    assert "must be relative" in outcomes[1].text
    assert outcomes[4].failure is None


def test_a_link_planted_by_a_command_is_followed_only_inside_the_sandbox(tmp_path: Path):
    # The file tools run in the sandbox, so a link to a host file reads what the sandbox sees
    # there (nothing of the host's private files), and writing through it cannot reach the host.
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    secret.chmod(0o600)
    outcomes = asyncio.run(
        run_calls(
            [
                call("bash", command=f"ln -s {secret} link.txt"),
                call("read_file", path="link.txt"),
                call("write_file", path="link.txt", content="overwritten"),
            ]
        )
    )
    assert "host secret" not in outcomes[1].text
    assert outcomes[1].text.startswith("error: link.txt: ")
    assert secret.read_text() == "host secret\n"


def test_a_missing_file_and_an_unknown_tool_are_observations_not_crashes():
    missing, unknown = asyncio.run(
        run_calls([call("read_file", path="nope.txt"), call("edit_file", path="a", old_text="b")])
    )
    assert missing.text == "error: nope.txt: No such file or directory"
    assert unknown.failure is ToolFailure.UNKNOWN_TOOL  # edit_file is the SWE toolbox's


def record(name: str, result: str | None = "ok", **arguments: object) -> ToolCallRecord:
    return ToolCallRecord(name, json.dumps(arguments), result)


def test_the_scorer_rebuilds_the_deliverables_from_the_calls_that_changed_files():
    env = GdpvalEnvironment(SETTINGS)
    task = GdpvalTask(rubric="r", deliverables=("summary.md",), setup=SALES_SETUP)
    calls = [
        record("bash", command="tail -n +2 sales.csv | cut -d, -f2 > amounts"),
        record("write_file", path="summary.md", content="draft\n"),
        record("bash", command="awk '{t+=$1} END {print \"Total: \" t}' amounts >> summary.md"),
        record("read_file", path="summary.md"),  # read-only: not replayed
        record("write_file", path="../x", content="refused in the episode, skipped"),
        record("write_file", f"{NOT_RUN_PREFIX}turn limit", path="summary.md", content="no"),
        record("write_file", None, path="summary.md", content="never run"),
    ]
    produced = env.produce_episode(env.replay_of(calls), task)
    assert produced == {"summary.md": b"draft\nTotal: 30\n"}


def test_an_episode_that_changed_no_file_scores_zero_without_a_sandbox_run():
    env = GdpvalEnvironment(SETTINGS)
    task = GdpvalTask(rubric="r", deliverables=("summary.md",), setup="")
    score = env.produce_episode(env.replay_of([record("list_files")]), task)
    assert not isinstance(score, dict)
    assert score.reward == 0.0 and ScoreFlag.INVALID_ACTION in score.flags


def test_a_deliverable_left_missing_by_the_episode_scores_zero_with_the_reason():
    env = GdpvalEnvironment(SETTINGS)
    task = GdpvalTask(rubric="r", deliverables=("summary.md",), setup="")
    score = env.produce_episode(env.replay_of([record("bash", command="true")]), task)
    assert not isinstance(score, dict)
    assert score.detail == "no deliverable 'summary.md'"


def test_episodes_do_not_share_a_work_directory():
    async def two() -> tuple[str, str]:
        toolbox = GdpvalToolbox(SETTINGS)
        first = await toolbox.open_session("g:0:d1:s0")
        second = await toolbox.open_session("g:0:d1:s1")
        try:
            await run_tool_call(first, call("write_file", path="a", content="1"), ToolLimits())
            seen = await run_tool_call(second, call("list_files"), ToolLimits())
            mine = await run_tool_call(first, call("list_files"), ToolLimits())
            return seen.text, mine.text
        finally:
            await first.aclose()
            await second.aclose()

    seen, mine = asyncio.run(two())
    assert (seen, mine) == ("", "a\n")
