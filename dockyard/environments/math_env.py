"""``math``: verifiable answers (final boxed answer or last number) against the ground truth."""

from __future__ import annotations

import asyncio
import functools

from dockyard.config.sections.env import HleEnvConfig, MathEnvConfig
from dockyard.environments.base import (
    Environment,
    GroupScore,
    InvalidScoringInput,
    JSONValue,
    SampleScore,
    ScoreFlag,
    ScoringGroup,
)
from dockyard.environments.math_answers import (
    Equivalence,
    SymbolicChecker,
    answers_equivalent,
    extract_answer,
)
from dockyard.environments.math_check_pool import MathCheckPool
from dockyard.environments.registry import register_environment


def ground_truth_text(group: ScoringGroup, keys: tuple[str, ...] = ("answer", "solution")) -> str:
    """The reference answer: ``group.ground_truth`` itself, or ``extra['answer']``."""
    candidates: list[JSONValue] = [group.ground_truth, *(group.extra.get(key) for key in keys)]
    for candidate in candidates:
        if isinstance(candidate, bool):
            continue
        if isinstance(candidate, str | int | float):
            return str(candidate)
    raise InvalidScoringInput(
        "missing_ground_truth", f"group {group.group_id} has no scalar ground truth for {keys}"
    )


def symbolic_checker(
    pool: MathCheckPool, settings: MathEnvConfig | HleEnvConfig
) -> SymbolicChecker | None:
    """The pool's check bound to ``env.<name>.check_timeout_s``; None when
    ``symbolic_equivalence`` is off (text and numbers only)."""
    if not settings.symbolic_equivalence:
        return None
    return functools.partial(pool.check, timeout_s=settings.check_timeout_s)


def score_math_answer(
    response: str, truth: str, settings: MathEnvConfig, checker: SymbolicChecker | None
) -> SampleScore:
    extracted = extract_answer(response, settings.answer_format)
    if extracted is None:
        return SampleScore(
            reward=0.0,
            components={"correct": 0.0, "has_answer": 0.0},
            flags=frozenset({ScoreFlag.INVALID_ACTION}),
            detail="no answer found",
        )
    verdict = answers_equivalent(
        extracted.text,
        truth,
        relative_tolerance=settings.relative_tolerance,
        checker=checker,
    )
    return judged_answer_score(verdict, extracted.source, extracted.text)


def judged_answer_score(verdict: Equivalence, source: str, text: str) -> SampleScore:
    """The score of a stated answer (found as ``source``) that a checker judged: 1 if equal to
    the truth, else 0; a check that timed out or whose worker died is flagged."""
    flags = frozenset(
        {"timeout": {ScoreFlag.CHECK_TIMEOUT}, "crashed": {ScoreFlag.CHECK_CRASHED}}.get(
            verdict.method, ()
        )
    )
    correct = 1.0 if verdict.equal else 0.0
    return SampleScore(
        reward=correct,
        components={"correct": correct, "has_answer": 1.0},
        flags=flags,
        detail=f"{source} answer {text[:80]!r}: {verdict.method}",
    )


class MathCheckingEnvironment(Environment):
    """An environment that checks answers with math-verify in a worker-process pool of its own
    (``symbolic_checker``), closed with the environment."""

    def __init__(self, settings: MathEnvConfig | HleEnvConfig) -> None:
        super().__init__(settings)
        self._pool = MathCheckPool(max_workers=settings.max_concurrency)
        self._checker = symbolic_checker(self._pool, settings)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._pool.close)


@register_environment
class MathEnvironment(MathCheckingEnvironment):
    """Reward 1 for an answer equivalent to the ground truth, else 0.

    Equivalence is CPU work (math-verify in worker processes, one per task in flight), so the
    group is scored in a worker thread that waits on them.
    """

    name = "math"
    settings: MathEnvConfig

    async def score(self, group: ScoringGroup) -> GroupScore:
        truth = ground_truth_text(group)
        return await asyncio.to_thread(self._score_sync, group, truth)

    def _score_sync(self, group: ScoringGroup, truth: str) -> GroupScore:
        scores = [
            score_math_answer(s.answer_text, truth, self.settings, self._checker)
            for s in group.samples
        ]
        return GroupScore(group_id=group.group_id, samples=scores)
