"""``code``: program synthesis, scored by running the program on stdin/stdout test cases.

Ground truth: a list of cases, as ``group.ground_truth`` (a list, or a mapping with ``tests``)
or ``extra["tests"]`` (``data.*.fields.tests``). A case is ``{"input": str, "output": str}``
(the program's stdout for that stdin) or ``{"assert": str}`` (Python run after the program in
its namespace, MBPP style). Each case runs in its own sandbox session (fresh directory and uid),
so no state leaks from one case to the next. The program is the last fenced code block of the
response (```` ```python ```` preferred), or the whole response if it has no fence.

An ``assert`` case passes only if the harness reaches its end: it exits with a status drawn at
random per run and handed over on stdin (in no file the program can read), so a program that
exits early (``sys.exit(0)``) or swallows the assertion fails. The checks run in a process of
their own that never imports the program (:mod:`.assert_checks`): no frame of the program's
holds the status, and what a call returns arrives as a plain value (an ``int`` subclass whose
``__eq__`` is always true arrives as its digits).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dockyard.config.sections.env import CodeEnvConfig
from dockyard.environments.assert_checks import CHECKER, HOST
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
from dockyard.environments.reward_hack_screen import describe, screen_source
from dockyard.environments.sandbox import Sandbox, SandboxResult

_Result = TypeVar("_Result")
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3"}


@dataclass(frozen=True)
class TestCase:
    stdin: str = ""
    expected_stdout: str = ""
    # Python assertions run after the program (an ``assert`` case); None for stdin/stdout.
    assertions: str | None = None


@dataclass(frozen=True)
class CaseOutcome:
    passed: bool
    result: SandboxResult
    note: str | None = None  # why a run that exited cleanly still failed, when not wrong output


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
    elif isinstance(raw, str):
        raw = None  # a file dataset's answer (a reference solution), not the tests
    if raw is None:
        raw = group.extra.get("tests")
    if not isinstance(raw, Sequence) or isinstance(raw, str) or not raw:
        raise InvalidScoringInput("missing_test_cases", f"group {group.group_id} has no tests")
    cases: list[TestCase] = []
    for index, case in enumerate(raw):
        if isinstance(case, Mapping) and isinstance(assertions := case.get("assert"), str):
            cases.append(TestCase(assertions=assertions))
            continue
        if not isinstance(case, Mapping) or not isinstance(output := case.get("output"), str):
            raise InvalidScoringInput(
                "bad_test_case", f"test {index} needs an 'output' or an 'assert' string"
            )
        stdin = case.get("input", "")
        cases.append(TestCase(stdin if isinstance(stdin, str) else "", output))
    return cases


SampleWork = Callable[[str, float, threading.Event], _Result]


async def map_samples_in_thread(
    group: ScoringGroup, task_timeout: float, work: SampleWork[_Result]
) -> list[_Result]:
    """``work(response_text, deadline, cancel)`` for each sample, in a worker thread (sandboxed
    runs block), all within ``task_timeout``; cancelling the caller cancels the runs."""
    deadline = time.monotonic() + task_timeout
    cancel = threading.Event()

    def run_all() -> list[_Result]:
        return [work(sample.response_text, deadline, cancel) for sample in group.samples]

    try:
        return await asyncio.to_thread(run_all)
    except asyncio.CancelledError:
        cancel.set()  # the worker thread kills its sandbox within one poll interval
        raise


async def score_samples_in_thread(
    group: ScoringGroup, task_timeout: float, score_sample: SampleWork[SampleScore]
) -> GroupScore:
    scores = await map_samples_in_thread(group, task_timeout, score_sample)
    return GroupScore(group_id=group.group_id, samples=scores)


@register_environment
class CodeEnvironment(Environment):
    name = "code"
    settings: CodeEnvConfig

    def __init__(self, settings: CodeEnvConfig) -> None:
        super().__init__(settings)
        self.sandbox = Sandbox(settings.limits)

    async def score(self, group: ScoringGroup) -> GroupScore:
        cases = parse_test_cases(group)
        return await score_samples_in_thread(
            group,
            self.settings.task_timeout,
            lambda text, deadline, cancel: self.score_program(text, cases, deadline, cancel),
        )

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
        if self.settings.screen_reward_hacks and (evidence := screen_source(program, "program.py")):
            # Not run: a reward-hack shape scores 0 and is reported (the scorer dead-letters
            # the group with this evidence), so a run sees its policy start to hack.
            return SampleScore(
                0.0,
                {"pass_fraction": 0.0, "tests_passed": 0.0},
                frozenset({ScoreFlag.SUSPECTED_REWARD_HACK}),
                describe(evidence)[:500],
            )
        all_pass = self.settings.reward_mode == "all_pass"
        outcomes: list[CaseOutcome] = []
        for case in cases:
            outcomes.append(self._run_case(program, case, deadline, cancel))
            passed = outcomes[-1].passed
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

    def _run_case(
        self,
        program: str,
        case: TestCase,
        deadline: float | None,
        cancel: threading.Event | None,
    ) -> CaseOutcome:
        if case.assertions is None:
            result = self.sandbox.run_python(
                program, stdin=case.stdin.encode(), deadline=deadline, cancel=cancel
            )
            passed = result.ok and normalize_output(
                result.stdout.decode(errors="replace")
            ) == normalize_output(case.expected_stdout)
            return CaseOutcome(passed, result)
        status = 3 + secrets.randbelow(120)  # not 0-2: what an early or failed exit gives
        with self.sandbox.session() as session:
            session.write_file("solution.py", program.encode())
            session.write_file("host.py", HOST.encode(), mode=0o444)
            session.write_file("checker.py", CHECKER.encode(), mode=0o444)
            # The checks travel on stdin after the status: no file of the run holds them.
            result = session.run_python(
                "checker.py",
                stdin=f"{status}\n{case.assertions}".encode(),
                deadline=deadline,
                cancel=cancel,
            )
        passed = result.returncode == status and not result.timed_out
        early = None if passed or result.returncode != 0 else "exited before its checks ran"
        return CaseOutcome(passed, result, early)


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
            reason = first_failure.note or "wrong output"
        text += f"; first failure: {reason}"
    return text
