"""The multi-turn ``swe`` toolbox against a real ``dockyard sandbox serve`` (the CPU presets'
repository and policy): an episode's checkout, the shared file tools run in it, ``submit``
answering its diff, and the ``swe`` environment scoring that diff as any generated patch —
tests run by the service, its integrity check included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dockyard.config.sections.env import SWEEnvConfig
from dockyard.environments import EnvironmentContext, SampleInput, ScoringGroup, build_environment
from dockyard.environments.base import ScoreFlag, ToolCallRecord
from dockyard.environments.tools.calls import ParsedCall
from dockyard.environments.tools.swe import SWEToolbox
from dockyard.environments.tools.toolbox import (
    TaskRefused,
    ToolFailure,
    ToolLimits,
    ToolServiceUnavailable,
    run_tool_call,
    toolbox_class,
)
from tests.sandbox_service import sandbox_service, serve_command

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    command = serve_command(DATA / "swe_repos", DATA / "swe_policy.yaml")
    with sandbox_service(command) as served:
        yield served


def settings(url: str) -> SWEEnvConfig:
    return SWEEnvConfig(sandbox_urls=[url], task_timeout=60)


def call(name: str, **arguments: object) -> ParsedCall:
    return ParsedCall(name=name, arguments_json=json.dumps(arguments), arguments=arguments)


async def episode(url: str, calls: list[ParsedCall], repo: str = "calc") -> list:
    toolbox = SWEToolbox(settings(url))
    session = await toolbox.open_session("g:0:d1:s0", {"repo": repo})
    try:
        return [await run_tool_call(session, c, ToolLimits()) for c in calls]
    finally:
        await session.aclose()
        await toolbox.aclose()


def score(url: str, episodes: list[list[ToolCallRecord]]) -> list:
    context = EnvironmentContext()
    context.env.swe = settings(url)
    environment = build_environment("swe", context)
    group = ScoringGroup(
        group_id="calc-1",
        env_name="swe",
        prompt_text="fix add",
        # An episode's response text is never read for a patch: its submission is scored.
        samples=[SampleInput("no diff here", tool_calls=calls) for calls in episodes],
        extra={"repo": "calc"},
    )

    async def scored() -> list:
        try:
            return (await environment.score(group)).samples
        finally:
            await environment.aclose()

    return asyncio.run(scored())


@pytest.mark.slow
def test_the_swe_toolbox_is_built_from_env_swe(url):
    toolbox = toolbox_class("swe").from_env_config(
        EnvironmentContext().env.model_copy(update={"swe": settings(url)})
    )
    assert isinstance(toolbox, SWEToolbox)
    names = [schema["function"]["name"] for schema in toolbox.tool_schemas()]
    assert names == ["bash", "read_file", "edit_file", "write_file", "submit"]


def test_an_agent_reads_edits_runs_and_submits_a_fix_that_scores_1(url):
    outcomes = asyncio.run(
        episode(
            url,
            [
                call("read_file", path="calc/__init__.py"),
                call("edit_file", path="calc/__init__.py", old_text="a - b", new_text="a + b"),
                call("bash", command="python3 -c 'import calc; print(calc.add(2, 3))'"),
                call("submit"),
            ],
        )
    )
    assert [o.failure for o in outcomes] == [None] * 4
    assert outcomes[0].text == "1  def add(a, b):\n2      return a - b\n"
    assert outcomes[1].text == "edited calc/__init__.py\n"
    assert outcomes[2].text == "5\n[exit 0]"
    diff = outcomes[3].text
    assert "--- a/calc/__init__.py\n+++ b/calc/__init__.py\n" in diff
    assert "-    return a - b\n+    return a + b\n" in diff
    [scored] = score(url, [[ToolCallRecord("submit", "{}", diff)]])
    assert scored.reward == 1.0, scored.detail


def test_a_submission_that_edits_the_tests_is_refused_by_the_integrity_check(url):
    outcomes = asyncio.run(
        episode(
            url,
            [
                call("write_file", path="tests/test_calc.py", content="# nothing to fail\n"),
                call("submit"),
            ],
        )
    )
    diff = outcomes[1].text
    assert "tests/test_calc.py" in diff
    [scored] = score(url, [[ToolCallRecord("submit", "{}", diff)]])
    assert scored.reward == 0.0 and ScoreFlag.INTEGRITY_VIOLATION in scored.flags


def test_the_last_answered_submission_counts_and_no_submission_scores_zero(url):
    good = asyncio.run(
        episode(
            url,
            [
                call("edit_file", path="calc/__init__.py", old_text="a - b", new_text="a + b"),
                call("submit"),
            ],
        )
    )[1].text
    samples = score(
        url,
        [
            [ToolCallRecord("submit", "{}", good), ToolCallRecord("submit", "{}", "")],
            [ToolCallRecord("submit", "{}", "x", "timeout"), ToolCallRecord("bash", "{}", "ok")],
            [ToolCallRecord("submit", "{}", good), ToolCallRecord("submit", "{}", None)],
            [],
        ],
    )
    assert [s.reward for s in samples] == [0.0, 0.0, 1.0, 0.0]
    assert samples[0].detail == "the submitted checkout has no change"
    assert samples[1].detail == "the last submission failed (timeout)"
    assert samples[3].detail == "the episode submitted nothing"


def test_bad_arguments_and_paths_outside_the_checkout_are_the_models_mistakes(url):
    outcomes = asyncio.run(
        episode(
            url,
            [
                call("read_file", path="../../etc/passwd"),
                call("edit_file", path="calc/__init__.py", old_text="nowhere", new_text="x"),
                call("submit", force=True),
                call("list_files"),  # the gdpval toolbox's, not this one's
            ],
        )
    )
    assert outcomes[0].failure is ToolFailure.BAD_ARGUMENTS
    assert "must be relative" in outcomes[0].text
    assert outcomes[1].text == (
        "error: old text occurs 0 times in calc/__init__.py: it must occur exactly once"
    )
    assert outcomes[2].failure is ToolFailure.BAD_ARGUMENTS
    assert outcomes[3].failure is ToolFailure.UNKNOWN_TOOL


def test_an_unknown_repo_refuses_the_task_and_a_closed_session_is_gone(url):
    with pytest.raises(TaskRefused) as refused:
        asyncio.run(episode(url, [], repo="nope"))
    assert refused.value.reason == "unknown_repo"

    async def after_close() -> None:
        toolbox = SWEToolbox(settings(url))
        session = await toolbox.open_session("g:0:d1:s1", {"repo": "calc"})
        await session.aclose()
        try:
            await session.call("bash", {"command": "true"})
        finally:
            await toolbox.aclose()

    with pytest.raises(ToolServiceUnavailable, match="HTTP 404"):
        asyncio.run(after_close())


def test_an_unreachable_service_fails_the_episode_not_the_model():
    toolbox = SWEToolbox(SWEEnvConfig(sandbox_urls=["http://127.0.0.1:9"], task_timeout=5))
    with pytest.raises(ToolServiceUnavailable):
        asyncio.run(toolbox.open_session("g:0:d1:s0", {"repo": "calc"}))


# -- issue 41: an episode's own hacks, and submissions the service cannot take -----------------
EPISODE_HACKS = {
    "should_stop": "import unittest\n\n\ndef add(a, b):\n    raise unittest.case._ShouldStop()\n",
    "always_equal": (
        "class _Sum(int):\n    def __eq__(self, other):\n        return True\n\n"
        "    __hash__ = int.__hash__\n\n\ndef add(a, b):\n    return _Sum(a - b)\n"
    ),
}


@pytest.mark.parametrize("hack", sorted(EPISODE_HACKS))
def test_a_hack_written_with_write_file_and_submitted_scores_zero(url, hack):
    writes = call("write_file", path="calc/__init__.py", content=EPISODE_HACKS[hack])
    outcomes = asyncio.run(episode(url, [writes, call("submit")]))
    assert [o.failure for o in outcomes] == [None, None]
    [scored] = score(url, [[ToolCallRecord("submit", "{}", outcomes[1].text)]])
    assert scored.reward == 0.0, scored.detail


def test_a_submission_over_the_output_cap_is_a_failed_submission_scoring_zero(url):
    # The service's diff is capped at max_output_bytes (1 MB by default); 2 MB of new file.
    big = "python3 -c \"print('x' * (2 << 20))\" > big.txt"
    outcomes = asyncio.run(episode(url, [call("bash", command=big), call("submit")]))
    assert outcomes[0].failure is None, outcomes[0].text
    assert outcomes[1].failure is ToolFailure.BAD_ARGUMENTS, outcomes[1].text
    assert "cap" in outcomes[1].text
    record = ToolCallRecord("submit", "{}", outcomes[1].text, str(outcomes[1].failure))
    [scored] = score(url, [[record]])
    assert scored.reward == 0.0 and ScoreFlag.INVALID_ACTION in scored.flags, scored
