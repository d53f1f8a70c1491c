"""Answer extraction and equivalence for the math environment, including hostile inputs."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pydantic
import pytest

from dockyard.config.sections.env import MathEnvConfig
from dockyard.environments import (
    EnvironmentContext,
    InvalidScoringInput,
    SampleInput,
    ScoreFlag,
    ScoringGroup,
    build_environment,
)
from dockyard.environments.math_answers import (
    answers_equivalent,
    extract_answer,
    extract_boxed,
    extract_last_number,
)
from dockyard.environments.math_check_pool import MathCheckPool

# A deadline no legitimate check here comes near, for tests that are not about the deadline.
_GENEROUS_S = 120.0
# The power tower math-verify (sympy) evaluates until killed: it can only end by the deadline.
_TOWER = "9^{9^{9^{9}}}"


@pytest.fixture(scope="module")
def pool() -> Iterator[MathCheckPool]:
    checks = MathCheckPool(max_workers=1)
    yield checks
    checks.close()


@pytest.fixture
def checker(pool: MathCheckPool):
    return functools.partial(pool.check, timeout_s=_GENEROUS_S)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{\frac{\sqrt{3}}{\left(2\right)}}", r"\frac{\sqrt{3}}{\left(2\right)}"),
        (r"first \boxed{1} then \boxed{2}", "2"),  # the final boxed answer wins
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are content
        (r"\fbox{7}", "7"),
        (r"\boxed 5 is it", "5"),
        (r"\boxed{unclosed \frac{1}{2}", None),  # malformed: no boxed answer
        ("no box here", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,234.5 apples.", "1,234.5"),
        ("It is -3/4.", "-3/4"),
        ("x = 12.", "12"),
        ("about 3.5e2 or 7", "7"),
        ("growth of 12%", "12%"),
        ("no digits", None),
    ],
)
def test_extract_last_number(text: str, expected: str | None) -> None:
    assert extract_last_number(text) == expected


def test_extract_answer_falls_back_to_last_number_unless_boxed_only() -> None:
    text = r"malformed \boxed{3 so maybe 4"
    assert extract_answer(text, "boxed_or_last_number").text == "4"
    assert extract_answer(text, "boxed") is None
    assert extract_answer(r"\boxed{9} and 10", "last_number").text == "10"


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("42", "42.0"),
        ("1,234", "1234"),
        ("-7", "-7.00"),
        ("3/4", "0.75"),
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{-3}{4}", "-0.75"),
        ("1e3", "1000"),
        ("2.5E-1", "1/4"),
        ("50%", "0.5"),
        ("50%", "50"),
        (r"50\%", "0.5"),
        ("x = 5", "5"),
        (r"$12$", "12"),
        (r"\text{12 }", "12"),
        ("x^2", "x**2"),
        ("2x+1", "1+2*x"),
        ("(x+1)^2", "x^2+2x+1"),
        (r"\frac{x}{2}", "x/2"),
        (r"\sqrt{2}", "2^{1/2}"),
        (r"\sqrt[3]{8}", "2"),
        (r"\frac{\sqrt{3}}{2}", r"\sin(\pi/3)"),
        (r"2\pi", "6.283185307179586"),
        ("2^{3^{2}}", "512"),
        # Forms math-verify reads that the hand-written sympy checker did not.
        (r"\frac34", r"\dfrac{3}{4}"),
        (r"\sqrt 2", r"\sqrt{2}"),
        (r"\{2, 1\}", r"\{1, 2\}"),
        ("[0,1)", "[0, 1)"),
    ],
)
def test_equivalent(answer: str, truth: str, checker) -> None:
    assert answers_equivalent(answer, truth, checker=checker).equal


@pytest.mark.parametrize(
    ("answer", "truth"),
    [
        ("41", "42"),
        ("-5", "5"),
        ("1,2", "12"),
        ("0.5", "0.6"),
        ("x+1", "x+2"),
        ("x^2", "x^3"),
        (r"\frac{1}{2", "1/2"),  # malformed latex
        ("1/0", "1"),
        ("", "1"),
        ("__import__('os').system('true')", "0"),  # never reaches eval
        ("lambda: 1", "1"),
        ("(2,1)", "(1, 2)"),  # an ordered pair (or open interval), not a set
        ("[0,1]", "[0, 1)"),
    ],
)
def test_not_equivalent(answer: str, truth: str, checker) -> None:
    assert not answers_equivalent(answer, truth, checker=checker).equal


@pytest.mark.parametrize(
    "hostile",
    [
        "10**10**10",
        "9^{9^{9}}",
        "2^{10^{100}}",
        "exp(exp(exp(100)))",
        "x^{x^{x^{x^{x}}}}",
        "1e999999999",
        "10^" + "9" * 300,
        "(" * 200 + "1" + ")" * 200,
    ],
)
@pytest.mark.slow
def test_hostile_expressions_are_not_equal_and_never_raise(hostile: str, pool) -> None:
    # The deadline may or may not be what ends a check here; either way: 0, with a reason.
    verdict = answers_equivalent(hostile, "1", checker=functools.partial(pool.check, timeout_s=2.0))
    assert not verdict.equal
    assert verdict.method in ("symbolic", "unparsed", "timeout")


def test_a_check_past_its_deadline_is_killed_and_the_pool_serves_the_next() -> None:
    checks = MathCheckPool(max_workers=1)
    try:
        assert checks.check("1", "1", timeout_s=_GENEROUS_S) == "equal"  # a worker is up
        (first_pid,) = checks.worker_pids
        assert checks.check(_TOWER, "1", timeout_s=1.0) == "timeout"
        assert checks.worker_pids == []  # the overrunning worker is gone, not left computing
        assert checks.check(r"\frac{\sqrt{4}}{4}", r"\frac12", timeout_s=_GENEROUS_S) == "equal"
        (second_pid,) = checks.worker_pids
        assert second_pid != first_pid
    finally:
        checks.close()
    assert checks.worker_pids == []


def test_check_timeout_must_be_positive() -> None:
    for bad in (0, -1.0):
        with pytest.raises(pydantic.ValidationError, match="check_timeout_s"):
            MathEnvConfig(check_timeout_s=bad)


def test_relative_tolerance_and_symbolic_switch(checker) -> None:
    assert answers_equivalent("3.1415927", r"\pi", relative_tolerance=1e-6, checker=checker).equal
    assert not answers_equivalent("3.14", r"\pi", relative_tolerance=1e-6, checker=checker).equal
    assert not answers_equivalent("x^2", "x**2", checker=None).equal
    assert not answers_equivalent("1.0000001", "1", relative_tolerance=0.0).equal


def _group(truth: object, *responses: str) -> ScoringGroup:
    return ScoringGroup(
        group_id="g1",
        env_name="math",
        prompt_text="What is it?",
        samples=[SampleInput(response_text=text) for text in responses],
        ground_truth=truth,
    )


async def test_math_environment_scores_a_group() -> None:
    context = EnvironmentContext()
    context.env.math = MathEnvConfig(check_timeout_s=3.0)
    environment = build_environment("math", context)
    group = _group(
        "1/2",
        r"Thus \boxed{\frac{1}{2}}.",
        "I think it is 0.5",
        r"\boxed{0.25}",
        "I do not know",
        rf"\boxed{{{_TOWER}}}",
        r"\boxed{\frac{\sqrt{4}}{4}}",  # checked after the tower's worker was killed
    )
    try:
        score = await environment.score(group)
    finally:
        await environment.aclose()
    assert score.group_id == "g1"
    assert score.rewards == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert score.samples[0].components == {"correct": 1.0, "has_answer": 1.0}
    assert ScoreFlag.INVALID_ACTION in score.samples[3].flags
    assert score.samples[3].components["has_answer"] == 0.0
    assert score.samples[4].flags == frozenset({ScoreFlag.CHECK_TIMEOUT})
    assert "timeout" in score.samples[4].detail


async def test_math_environment_respects_answer_format() -> None:
    context = EnvironmentContext()
    context.env.math = MathEnvConfig(answer_format="boxed")
    environment = build_environment("math", context)
    score = await environment.score(_group(7, "the answer is 7", r"\boxed{7}"))
    assert score.rewards == [0.0, 1.0]


async def test_ground_truth_from_extra_and_missing_ground_truth() -> None:
    environment = build_environment("math")
    group = ScoringGroup(
        group_id="g2",
        env_name="math",
        prompt_text="?",
        samples=[SampleInput("3")],
        extra={"answer": "3"},
    )
    assert (await environment.score(group)).rewards == [1.0]
    with pytest.raises(InvalidScoringInput) as error:
        await environment.score(_group(None, "3"))
    assert error.value.reason_code == "missing_ground_truth"


@pytest.mark.parametrize(
    "response",
    [
        r"\boxed{\frac{}{}}",  # parses to a tuple, not an expression
        r"\boxed{}",
        r"\boxed{\sqrt{}}",
        r"\boxed{()^{()}}",
        r"\boxed{\frac{(}{)}}",
        r"\boxed{9^{9^{9^{9}}}}",
        r"\boxed{__import__('os').system('true')}",
    ],
)
async def test_malformed_latex_scores_zero_with_a_reason(response: str) -> None:
    environment = build_environment("math")
    try:
        score = await environment.score(_group("7", response))
    finally:
        await environment.aclose()
    (sample,) = score.samples
    assert sample.reward == 0.0 and sample.detail
