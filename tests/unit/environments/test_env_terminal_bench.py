"""The single-turn terminal_bench environment on the shipped CPU-preset tasks: setup, the
response's commands and the check script in one real sandbox session."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.config.sections.env import SandboxLimits, TerminalBenchEnvConfig
from dockyard.data.catalog import build_dataset
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.terminal_bench_env import extract_commands

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "terminal_bench.jsonl"
FIELDS = FieldMapping(prompt="instruction", answer="solution", metadata=["setup", "check"])


def _records():
    config = DatasetConfig(name="terminal_bench", path=str(DATA), fields=FIELDS)
    return list(build_dataset(config, "terminal_bench").records)


def _environment(**settings: object):
    limits = SandboxLimits(wall_time_s=5.0, cpu_time_s=2.0, max_output_bytes=10_000)
    context = EnvironmentContext()
    context.env.terminal_bench = TerminalBenchEnvConfig(limits=limits, **settings)
    return build_environment("terminal_bench", context)


def _group(extra, *responses: str) -> ScoringGroup:
    return ScoringGroup(
        group_id="tb-1",
        env_name="terminal_bench",
        prompt_text="a task",
        samples=[SampleInput(response) for response in responses],
        extra=extra,
    )


def test_extract_commands_prefers_the_last_shell_block():
    text = "```python\nprint(1)\n```\n```bash\nls\n```\nthen\n```sh\nrm x\n```"
    assert extract_commands(text) == "rm x\n"
    assert extract_commands("```\ntouch a\n```") == "touch a\n"
    assert extract_commands("touch a") == "touch a"
    assert extract_commands("```bash\n \n```") is None


async def test_reference_solutions_solve_their_tasks_and_doing_nothing_does_not():
    environment = _environment()
    for record in _records():
        solved = f"```bash\n{record.ground_truth}```<|im_end|>"
        score = await environment.score(_group(record.extra, solved, "true"))
        assert score.rewards == [1.0, 0.0], [s.detail for s in score.samples]
        assert score.samples[1].detail.startswith("check failed (exit 1)")


async def test_samples_do_not_share_a_work_directory():
    hello = _records()[0]
    # The second sample would pass if the first one's file were still there.
    score = await _environment().score(_group(hello.extra, "echo hello > hello.txt", "true"))
    assert score.rewards == [1.0, 0.0]


async def test_the_commands_cannot_take_the_check_scripts_place():
    hello = _records()[0]
    # Plant files and directories under every name a script could take, and a fake `test`.
    plant = "mkdir -p .task-0 check.sh; printf '#!/bin/sh\\nexit 0\\n' > test; chmod +x test"
    score = await _environment().score(_group(hello.extra, plant))
    assert score.rewards == [0.0]


async def test_malformed_output_scores_zero_with_a_reason():
    hello = _records()[0]
    looping = "```bash\nwhile true; do :; done\n```"
    too_long = "```bash\n" + "echo x\n" * 5000 + "```"
    score = await _environment(max_script_chars=1000).score(
        _group(hello.extra, "", "<eos>", "```bash\nif then fi\n```", looping, too_long)
    )
    assert score.rewards == [0.0] * 5
    assert score.samples[0].detail == "no commands in the response"
    assert ScoreFlag.INVALID_ACTION in score.samples[1].flags
    assert score.samples[2].detail.startswith("check failed")
    assert score.samples[2].components["commands_exit"] == 2.0  # bash's syntax error status
    assert ScoreFlag.TEST_TIMEOUT in score.samples[3].flags
    assert "max_script_chars=1000" in score.samples[4].detail


async def test_a_task_without_a_check_or_with_a_failing_setup_is_refused():
    with pytest.raises(InvalidScoringInput, match="missing_check_script"):
        await _environment().score(_group({"setup": "true"}, "true"))
    with pytest.raises(InvalidScoringInput, match="setup_failed"):
        await _environment().score(_group({"setup": "exit 3", "check": "true"}, "true"))
