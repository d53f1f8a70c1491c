"""Math answer checking: the math environment's checker (``environments/math_answers.py``:
exact numbers by hand, the rest math-verify in a killable worker pool) against math-verify
alone, on a labelled corpus of real answers.

Each case is (reference answer, model response, whether a mathematician would call the response
correct). The label comes from the mathematics, not from either checker. Printed: each
checker's accuracy against the labels, their agreement, and every case where they differ —
the evidence for which path to keep.

math-verify alone runs in the main thread here (its timeouts use ``signal.alarm``, which works
only there); the environment's checker runs it in worker processes killed at
``check_timeout_s`` (default 5 s), as the scorer does.

    python benchmarks/math_answer_agreement.py
"""

from __future__ import annotations

from dataclasses import dataclass

from math_verify import parse, verify

from dockyard.config.sections.env import MathEnvConfig
from dockyard.environments.math_check_pool import MathCheckPool
from dockyard.environments.math_env import score_math_answer, symbolic_checker


@dataclass(frozen=True)
class Case:
    truth: str
    response: str
    correct: bool


CASES = (
    # plain numbers and formatting
    Case("42", r"So the answer is \boxed{42}.", True),
    Case("42", r"\boxed{42.0}", True),
    Case("42", r"\boxed{41}", False),
    Case("1234", r"\boxed{1,234}", True),
    Case("0.5", r"\boxed{\frac{1}{2}}", True),
    Case(r"\frac{1}{2}", r"\boxed{0.5}", True),
    Case(r"\frac{1}{3}", r"\boxed{0.33}", False),
    Case(r"\dfrac{3}{4}", r"\boxed{\frac34}", True),
    Case("50\\%", r"\boxed{0.5}", True),
    Case("-3", r"\boxed{-3}", True),
    Case("-3", r"\boxed{3}", False),
    Case("2.5e3", r"\boxed{2500}", True),
    # radicals, pi, expressions
    Case(r"\sqrt{2}", r"\boxed{\sqrt 2}", True),
    Case(r"2\sqrt{2}", r"\boxed{\sqrt{8}}", True),
    Case(r"\frac{\sqrt{3}}{2}", r"\boxed{\frac{1}{2}\sqrt{3}}", True),
    Case(r"\pi", r"\boxed{\pi}", True),
    Case(r"2\pi", r"\boxed{6.28}", False),
    Case(r"x^2+2x+1", r"\boxed{(x+1)^2}", True),
    Case(r"x^2-1", r"\boxed{(x-1)(x+1)}", True),
    Case(r"x^2-1", r"\boxed{(x-1)^2}", False),
    Case(r"\frac{x}{2}", r"\boxed{0.5x}", True),
    # sets, intervals, tuples, equations, text
    Case(r"\{1, 2\}", r"\boxed{\{2, 1\}}", True),
    Case(r"(1, 2)", r"\boxed{(1,2)}", True),
    Case(r"(1, 2)", r"\boxed{(2,1)}", False),
    Case(r"[0, 1)", r"\boxed{[0,1)}", True),
    Case(r"[0, 1)", r"\boxed{[0,1]}", False),
    Case("x = 3", r"\boxed{3}", True),
    Case("3", r"\boxed{x=3}", True),
    Case(r"\text{(B)}", r"\boxed{B}", True),
    Case("5", r"The final answer is $5$.", True),
    Case("5", "I think it is 5 apples", True),
    Case(r"10^{3}", r"\boxed{1000}", True),
    Case(r"\infty", r"\boxed{\infty}", True),
    # malformed / hostile model output: never correct, never a crash
    Case("7", r"\boxed{", False),
    Case("7", r"\boxed{\frac{7}{", False),
    Case("7", r"\boxed{7", False),
    Case("7", "no answer at all", False),
    Case("7", r"\boxed{\left( 7 \right.}", True),
    Case("7", r"\boxed{}", False),
    Case("7", r"\boxed{9^{9^{9^{9}}}}", False),
    Case("7", r"\boxed{\frac{}{}}", False),
    Case("7", r"\boxed{__import__('os').system('true')}", False),
)


Verdict = bool | str  # a checker's verdict, or "crash: ..." when it raised


def environment_checker(case: Case, pool: MathCheckPool) -> Verdict:
    settings = MathEnvConfig()
    try:
        score = score_math_answer(
            case.response, case.truth, settings, symbolic_checker(pool, settings)
        )
        return score.reward == 1.0
    except Exception as error:  # a crash is a finding here, not the end of the measurement
        return f"crash: {type(error).__name__}"


def math_verify(case: Case) -> Verdict:
    try:
        return bool(verify(parse(f"${case.truth}$"), parse(case.response)))
    except Exception as error:
        return f"crash: {type(error).__name__}"


def main() -> None:
    results = []
    pool = MathCheckPool(max_workers=1)
    try:
        for case in CASES:
            mine = environment_checker(case, pool)
            theirs = math_verify(case)
            results.append((case, mine, theirs))
    finally:
        pool.close()
    n = len(results)
    right_mine = sum(mine == case.correct for case, mine, _ in results)
    right_theirs = sum(theirs == case.correct for case, _, theirs in results)
    agree = sum(mine == theirs for _, mine, theirs in results)
    print(f"cases: {n}")
    print(f"math environment:     {right_mine}/{n} agree with the labels")
    print(f"math-verify:          {right_theirs}/{n} agree with the labels")
    print(f"the two agree on {agree}/{n}")
    crashes = [(c, m, t) for c, m, t in results if isinstance(m, str) or isinstance(t, str)]
    print(f"crashes: {len(crashes)}")
    for case, mine, theirs in results:
        if mine != theirs or mine != case.correct:
            print(
                f"  truth {case.truth!r:18} response {case.response!r:38} label {case.correct!s:5}"
                f" environment {mine!s:5} math-verify {theirs!s:5}"
            )


if __name__ == "__main__":
    main()
