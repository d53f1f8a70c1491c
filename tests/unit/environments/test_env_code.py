"""The code environment: generated programs against stdin/stdout tests, in the sandbox."""

from __future__ import annotations

import time

import pytest

from dockyard.config.sections.env import CodeEnvConfig, SandboxLimits
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
    score_with_timeout,
)
from dockyard.environments.code_env import extract_program

TESTS = [
    {"input": "2 3\n", "output": "5\n"},
    {"input": "10 -4\n", "output": "6"},
    {"input": "0 0\n", "output": "0\n"},
    {"input": "7 7\n", "output": "14\n"},
]
CORRECT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
HALF_RIGHT = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else a - b)\n```"


def _environment(**settings: object):
    limits = SandboxLimits(wall_time_s=2.0, cpu_time_s=1.0, max_output_bytes=10_000)
    context = EnvironmentContext()
    context.env.code = CodeEnvConfig(limits=limits, **settings)
    return build_environment("code", context)


def _group(*responses: str, tests: object = TESTS) -> ScoringGroup:
    return ScoringGroup(
        group_id="code-1",
        env_name="code",
        prompt_text="Add two integers.",
        samples=[SampleInput(response) for response in responses],
        ground_truth={"tests": tests},
    )


def test_extract_program_prefers_the_last_python_block() -> None:
    text = "```text\nnot code\n```\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```"
    assert extract_program(text) == "print(2)\n"
    assert extract_program("```\nprint(3)\n```") == "print(3)\n"
    assert extract_program("print(4)") == "print(4)"
    assert extract_program("   ") is None
    assert extract_program("```python\n\n```") is None


async def test_pass_fraction_rewards() -> None:
    no_code = "no code at all ```python\n```"
    score = await _environment().score(_group(CORRECT, HALF_RIGHT, no_code))
    assert score.rewards == [1.0, 0.5, 0.0]
    assert score.samples[0].components == {"pass_fraction": 1.0, "tests_passed": 4.0}
    assert score.samples[1].detail.startswith("2/4 tests passed; first failure: wrong output")
    assert ScoreFlag.INVALID_ACTION in score.samples[2].flags


async def test_all_pass_mode_gives_zero_for_a_partial_program() -> None:
    score = await _environment(reward_mode="all_pass").score(_group(CORRECT, HALF_RIGHT))
    assert score.rewards == [1.0, 0.0]


async def test_adversarial_programs_score_zero_with_flags_and_stay_bounded() -> None:
    responses = [
        "```python\nwhile True:\n    pass\n```",
        "```python\nimport sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n```",
        "```python\nx = bytearray(4 * 1024 ** 3)\n```",
        "```python\nimport os\nwhile True:\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\n```",
    ]
    started = time.monotonic()
    score = await _environment(reward_mode="all_pass").score(_group(*responses, tests=TESTS[:1]))
    assert score.rewards == [0.0, 0.0, 0.0, 0.0]
    assert ScoreFlag.TEST_TIMEOUT in score.samples[0].flags
    assert ScoreFlag.OUTPUT_LIMIT in score.samples[1].flags
    assert "MemoryError" in score.samples[2].detail
    assert ScoreFlag.TEST_TIMEOUT in score.samples[3].flags
    assert time.monotonic() - started < 15.0


async def test_memory_spread_over_processes_is_bounded_and_named() -> None:
    """The answer needs two processes of 150 MiB each (touched) at once, under a 256 MiB limit:
    each is under its per-process limit, the run is not; the kernel kills one of them, so no
    correct answer, and the detail says why."""
    program = (
        "```python\nimport os\nblock = b'x' * (150 << 20)\npid = os.fork()\n"
        "if pid == 0:\n    del block\n    other = b'y' * (150 << 20)\n    print(5, flush=True)\n"
        "    os._exit(0)\nos.waitpid(pid, 0)\n```"
    )
    limits = SandboxLimits(wall_time_s=10.0, cpu_time_s=5.0, memory_mb=256)
    context = EnvironmentContext()
    context.env.code = CodeEnvConfig(limits=limits)
    score = await build_environment("code", context).score(_group(program, tests=TESTS[:1]))
    assert score.rewards == [0.0]
    assert "memory limit of the run" in score.samples[0].detail


async def test_task_timeout_cancels_the_running_sandbox() -> None:
    environment = _environment(task_timeout=0.5, timeout_reward=-0.5)
    slow = "```python\nimport time\ntime.sleep(30)\n```"
    started = time.monotonic()
    score = await score_with_timeout(environment, _group(slow, slow))
    assert score.rewards == [-0.5, -0.5]
    assert all(ScoreFlag.TIMEOUT in sample.flags for sample in score.samples)
    assert time.monotonic() - started < 2.0
    # (the autouse fixture then checks the cancelled sandbox left no process behind)


@pytest.mark.parametrize("tests", [None, [], [{"input": "1"}], "print(1)"])
async def test_bad_test_cases_are_invalid_input(tests: object) -> None:
    with pytest.raises(InvalidScoringInput):
        await _environment().score(_group(CORRECT, tests=tests))
