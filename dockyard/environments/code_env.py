"""``code``: program synthesis, scored by running the program on stdin/stdout test cases.

Ground truth: a list of ``{"input": str, "output": str}`` cases, as ``group.ground_truth`` or
``extra["tests"]``. Each case runs in its own sandbox session (fresh directory and uid), so no
state leaks from one case to the next. The program is the last fenced code block of the response
(```` ```python ```` preferred), or the whole response if it has no fence.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dockyard.config.sections.env import CodeEnvConfig
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    JSONValue,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.registry import register_environment
from dockyard.environments.sandbox import Sandbox, SandboxResult

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}


@dataclass(frozen=True)
class TestCase:
    stdin: str
    expected_stdout: str


@dataclass(frozen=True)
class CaseOutcome:
    passed: bool
    result: SandboxResult


def extract_program(response: str) -> str | None:
    blocks = _FENCE.findall(response)
    python_blocks = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    chosen = python_blocks or [body for _, body in blocks]
    if chosen:
        return chosen[-1] if chosen[-1].strip() else None
    return response if response.strip() else None


def normalize_output(text: str) -> str:
    """Trailing spaces on each line and trailing blank lines do not count."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def parse_test_cases(group: ScoringGroup) -> list[TestCase]:
    raw: JSONValue = group.ground_truth
    if isinstance(raw, Mapping):
        raw = raw.get("tests")
    if raw is None:
        raw = group.extra.get("tests")
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise InvalidScoringInput("missing_test_cases", f"group {group.group_id} has no tests")
    cases: list[TestCase] = []
    for index, case in enumerate(raw):
        if not isinstance(case, Mapping) or not isinstance(case.get("output"), str):
            raise InvalidScoringInput("bad_test_case", f"test {index} needs an 'output' string")
        stdin = case.get("input", "")
        cases.append(TestCase(stdin if isinstance(stdin, str) else "", case["output"]))
    return cases


@register_environment
class CodeEnvironment(Environment):
    name = "code"
    settings: CodeEnvConfig

    def __init__(self, settings: CodeEnvConfig) -> None:
        super().__init__(settings)
        self.sandbox = Sandbox(settings.limits)

    async def score(self, group: ScoringGroup) -> GroupScore:
        cases = parse_test_cases(group)
        deadline = time.monotonic() + self.settings.task_timeout
        cancel = threading.Event()
        try:
            scores = await asyncio.to_thread(self._score_all, group, cases, deadline, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the worker thread kills its sandbox within one poll interval
            raise
        return GroupScore(group_id=group.group_id, samples=scores)

    def _score_all(
        self,
        group: ScoringGroup,
        cases: list[TestCase],
        deadline: float,
        cancel: threading.Event,
    ) -> list[SampleScore]:
        return [
            self.score_program(sample.response_text, cases, deadline, cancel)
            for sample in group.samples
        ]

    def score_program(
        self,
        response: str,
        cases: list[TestCase],
        deadline: float | None = None,
        cancel: threading.Event | None = None,
    ) -> SampleScore:
        program = extract_program(response)
        if program is None:
            return SampleScore(
                0.0, {"pass_fraction": 0.0}, frozenset({ScoreFlag.INVALID_ACTION}), "no code"
            )
        all_pass = self.settings.reward_mode == "all_pass"
        outcomes: list[CaseOutcome] = []
        for case in cases:
            result = self.sandbox.run_python(
                program, stdin=case.stdin.encode(), deadline=deadline, cancel=cancel
            )
            passed = result.ok and normalize_output(
                result.stdout.decode(errors="replace")
            ) == normalize_output(case.expected_stdout)
            outcomes.append(CaseOutcome(passed, result))
            if (all_pass and not passed) or (cancel is not None and cancel.is_set()):
                break  # the reward is already decided
        passed_count = sum(outcome.passed for outcome in outcomes)
        fraction = passed_count / len(cases)
        flags: set[ScoreFlag] = set()
        if any(outcome.result.timed_out for outcome in outcomes):
            flags.add(ScoreFlag.TEST_TIMEOUT)
        if any(outcome.result.output_limit_exceeded for outcome in outcomes):
            flags.add(ScoreFlag.OUTPUT_LIMIT)
        reward = float(passed_count == len(cases)) if all_pass else fraction
        return SampleScore(
            reward=reward,
            components={"pass_fraction": fraction, "tests_passed": float(passed_count)},
            flags=frozenset(flags),
            detail=_describe(outcomes, len(cases)),
        )


def _describe(outcomes: list[CaseOutcome], total: int) -> str:
    passed = sum(outcome.passed for outcome in outcomes)
    text = f"{passed}/{total} tests passed"
    first_failure = next((o for o in outcomes if not o.passed), None)
    if first_failure is not None:
        result = first_failure.result
        if result.timed_out:
            reason = "timed out"
        elif result.output_limit_exceeded:
            reason = "output limit"
        elif result.memory_limit_exceeded:
            reason = "memory limit of the run (killed by the kernel)"
        elif result.returncode != 0:
            tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
            reason = f"exit {result.returncode}: {tail[0][:120] if tail else ''}"
        else:
            reason = "wrong output"
        text += f"; first failure: {reason}"
    return text
