"""The program_bench environment on the shipped CPU-preset records: stdin/stdout and assert
cases in the real sandbox, reference solutions pass, malformed or cheating programs score 0 with
a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from dockyard.config.sections.data import DatasetConfig, FieldMapping
from dockyard.config.sections.env import ProgramBenchEnvConfig, SandboxLimits
from dockyard.data.base import DatasetError
from dockyard.data.catalog import build_dataset
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)

DATA = Path(__file__).resolve().parents[3] / "configs" / "cpu" / "data" / "program_bench.jsonl"
FIELDS = FieldMapping(answer="solution", tests="tests")


def _records():
    config = DatasetConfig(name="program_bench", path=str(DATA), fields=FIELDS)
    return {record.index: record for record in build_dataset(config, "program_bench").records}


def _environment(**settings: object):
    limits = SandboxLimits(wall_time_s=5.0, cpu_time_s=2.0, max_output_bytes=10_000)
    context = EnvironmentContext()
    context.env.program_bench = ProgramBenchEnvConfig(limits=limits, **settings)
    return build_environment("program_bench", context)


def _group(record, *responses: str) -> ScoringGroup:
    return ScoringGroup(
        group_id=f"pb-{record.index}",
        env_name="program_bench",
        prompt_text=record.prompt,
        samples=[SampleInput(response) for response in responses],
        ground_truth=record.ground_truth,  # the reference solution: not the tests
        extra=record.extra,
    )


def test_records_carry_their_test_cases_to_the_scorer():
    records = _records()
    assert len(records) == 4
    assert records[0].extra["tests"][0] == {"input": "2 3\n", "output": "5\n"}
    assert records[1].extra["tests"][0] == {"assert": "assert square(3) == 9"}


def test_a_malformed_test_case_is_refused_at_load_naming_record_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "solution": "s", "tests": [{"input": "1"}]}\n')
    config = DatasetConfig(name="pb", path=str(bad), fields=FIELDS)
    with pytest.raises(DatasetError, match=r"record 0 of .*bad.jsonl.*case 0") as caught:
        build_dataset(config, "program_bench")
    assert caught.value.key == "fields.tests"


async def test_reference_solutions_pass_every_case():
    environment = _environment()
    for record in _records().values():
        fenced = f"Here you go:\n```python\n{record.ground_truth}```<|im_end|>"
        unfenced = f"{record.ground_truth}<eos>"  # cut at the marker, not a syntax error
        score = await environment.score(_group(record, fenced, unfenced))
        assert score.rewards == [1.0, 1.0], [s.detail for s in score.samples]


async def test_assert_cases_fail_wrong_and_early_exiting_programs():
    square = _records()[1]
    wrong = "```python\ndef square(n):\n    return n + n\n```"  # right for 0 only
    early_exit = "```python\nimport sys\nsys.exit(0)\n```"
    swallows = (
        "```python\nimport sys, os\ndef square(n):\n    return 0\n"
        "sys.excepthook = lambda *a: os._exit(0)\n```"
    )
    score = await _environment().score(_group(square, wrong, early_exit, swallows))
    # square(0) == 0 holds for n + n and for 0: one case of three; the excepthook that exits
    # 0 on a failed assertion wins nothing more (the checks fail in a process of their own).
    assert score.rewards == [pytest.approx(1 / 3), 0.0, pytest.approx(1 / 3)]
    assert "exit 1" in score.samples[0].detail and "AssertionError" in score.samples[0].detail
    assert "exited before its checks ran" in score.samples[1].detail
    assert "AssertionError" in score.samples[2].detail


async def test_malformed_output_scores_zero_with_a_reason():
    add = _records()[0]
    score = await _environment(reward_mode="all_pass").score(
        _group(add, "", "<eos>", "```python\nprint(\n```", "I cannot solve this.")
    )
    assert score.rewards == [0.0, 0.0, 0.0, 0.0]
    assert score.samples[0].detail == "no code"
    assert ScoreFlag.INVALID_ACTION in score.samples[1].flags
    assert "SyntaxError" in score.samples[2].detail
    assert "exit 1" in score.samples[3].detail


async def test_a_record_without_tests_is_refused_not_scored():
    record = _records()[0]
    group = ScoringGroup("pb-x", "program_bench", "p", [SampleInput("print(1)")], "print(1)")
    with pytest.raises(InvalidScoringInput, match="missing_test_cases"):
        await _environment().score(group)
    assert record.extra  # the shipped record does have tests


# -- issue 41: programs that scored 1.0 without solving anything ------------------------------
READS_THE_DATASET = f"""```python
import json, sys
case = sys.stdin.read()
for line in open({str(DATA)!r}):
    for test in json.loads(line)["tests"]:
        if test.get("input") == case:
            print(test["output"], end="")
            sys.exit(0)
```"""
# Walks up from its own import to the harness's frame and leaves with the status it holds.
FRAME_WALKER = """```python
import os, sys
frame = sys._getframe()
while frame is not None:
    if isinstance(frame.f_locals.get("status"), int):
        os._exit(frame.f_locals["status"])
    frame = frame.f_back
def square(n):
    return 0
```"""
ALWAYS_EQUAL = """```python
class Square(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def square(n):
    return Square(0)
```"""


async def test_a_program_that_reads_the_shipped_dataset_scores_zero():
    add = _records()[0]
    score = await _environment().score(_group(add, READS_THE_DATASET))
    assert score.rewards == [0.0], score.samples[0].detail


async def test_walking_the_harness_frames_for_its_exit_status_scores_zero():
    # The harness alone (screen off): no frame of the program's holds the status.
    square = _records()[1]
    score = await _environment(screen_reward_hacks=False).score(_group(square, FRAME_WALKER))
    assert score.rewards == [pytest.approx(1 / 3)], score.samples[0].detail  # square(0) == 0


async def test_a_value_equal_to_everything_scores_zero():
    # The harness alone (screen off): no value of the program's own class reaches the checks.
    square = _records()[1]
    score = await _environment(screen_reward_hacks=False).score(_group(square, ALWAYS_EQUAL))
    assert score.rewards == [0.0], score.samples[0].detail


async def test_the_screen_reports_both_without_running_them():
    square = _records()[1]
    score = await _environment().score(_group(square, FRAME_WALKER, ALWAYS_EQUAL))
    assert score.rewards == [0.0, 0.0]
    assert [sorted(sample.flags) for sample in score.samples] == [
        [ScoreFlag.SUSPECTED_REWARD_HACK],
        [ScoreFlag.SUSPECTED_REWARD_HACK],
    ]
    assert "frame_walking at program.py:2: frame = sys._getframe()" in score.samples[0].detail
    assert "always_equal at program.py:2" in score.samples[1].detail
